"""Recording stand-in for Habana's ``habana_frameworks`` package (tests only).

Every function the runtime calls appends ``(name, details)`` to ``_calls`` and behaves plausibly
on CPU, so the HPU code path runs for real against CPU tensors.
"""
from __future__ import annotations

_calls: list = []


def record(name: str, **details) -> None:
    _calls.append((name, details))
