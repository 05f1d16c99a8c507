"""Lists of small integers (ranks, devices, cores) written short: [0, 1, 2, 3, 6] -> '0-3,6'. Pure."""

from __future__ import annotations

from collections.abc import Iterable


def id_ranges(ids: Iterable[int]) -> str:
    """'0-3,6' for [0, 1, 2, 3, 6], in any order, repeats ignored; '' for none."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def rank_words(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0-3,6'."""
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + id_ranges(ordered)
