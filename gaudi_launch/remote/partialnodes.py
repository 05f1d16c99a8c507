"""Partial nodes in a scale-out job (issue 32, item 6). Habana's "Gaudi-to-process Assignment", on
HABANA_VISIBLE_MODULES: "In scale-out scenarios, the number of elements in the list must be equal to the number
of Gaudis in the server"; subsets of a server are for scale-up (one host) only.
A job of several hosts that leaves cards out of one (``--include 'h1:4,5@h2:4,5'``) fails the pre-flight,
unless --allow-partial-nodes, which makes it a warning that says what Habana supports. Pure.
"""

from __future__ import annotations

ASSIGNMENT_PAGE = "https://docs.habana.ai/en/latest/PyTorch/PyTorch_Scaling_Guide/Gaudi_Assignment.html"


def partial_nodes(modules_needed: dict[str, list[int]], facts: dict) -> dict[str, str]:
    """{host: "modules A,B of N"} for each job host whose wanted module ids are not all of its cards (hl-smi's,
    from the pre-flight); none for a one-host job or a host whose cards are not known."""
    if len(modules_needed) < 2:
        return {}
    out = {}
    for host, modules in modules_needed.items():
        f = facts.get(host)
        have = sorted(c.module_id for c in f.cards.cards) if f is not None and f.cards and f.cards.cards else []
        if have and sorted(set(modules)) != have:
            out[host] = f"module(s) {','.join(str(m) for m in sorted(modules))} of its {len(have)} cards"
    return out


def judge(report, modules_needed: dict[str, list[int]], allow: bool) -> None:
    """Fail each partial node of a scale-out job (a preflight.CheckReport, in place); with ``allow``
    (--allow-partial-nodes), one warning naming them."""
    found = partial_nodes(modules_needed, report.facts)
    if not found:
        return
    said = (
        f"Habana's 'Gaudi-to-process Assignment' ({ASSIGNMENT_PAGE}): in scale-out the module list must hold "
        "every Gaudi of the server"
    )
    if allow:
        report.warnings.append(
            "partial nodes in a job of several hosts (--allow-partial-nodes: going on, which Habana does not "
            f"support): {'; '.join(f'{h} {w}' for h, w in found.items())}. {said}"
        )
        return
    for host, what in found.items():
        f = report.facts[host]
        reason = f"a job of several hosts on part of this host ({what}): {said}"
        if f.ok:
            f.ok, f.reason = False, reason
            f.fix = (
                "use every card of each host (no device list in --include or the hostfile's slots), "
                "or go on anyway with --allow-partial-nodes"
            )
        else:
            f.reason = f"{f.reason}; {reason}"
