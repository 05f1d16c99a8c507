"""Whether the ranks run where the plan put them (issue 25): each rank's bootstrap says its host when it
starts (wire.STARTED), and once every rank has, the ranks the plan put on one host must share one machine
and the ranks of different hosts must not (ranks silently all on one node is a known failure of other
launchers: a hostfile alias, a scheduler that ignored the host list). A machine is its hostname AND the address
it reaches the job's master from (``machine``): two machines that share a hostname (cloned images) differ by
address, the ranks of one machine share both. They are compared only with each other, never with the
hostfile's names, which may be addresses or ssh aliases. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from gaudi_launch.inputs.idranges import rank_words


def machine(hostname: str, address: str) -> str:
    """One token for wire.STARTED: ``hostname@address`` (the address may be empty: not known)."""
    return f"{hostname}@{address}" if address else hostname


def _shown(token: str) -> str:
    host, _, address = token.partition("@")
    return f"{host} ({address})" if address else host


def _groups(by_rank: Mapping[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rank, host in sorted(by_rank.items()):
        out.setdefault(host, []).append(rank)
    return out


def misplaced(planned: Mapping[int, str], reported: Mapping[int, str]) -> Optional[str]:
    """A message with both lists when the reported machines do not split the ranks as the plan does, else
    None (also while a planned rank has not reported yet)."""
    ranks = [r for r in planned if planned[r]]
    if not ranks or any(r not in reported for r in ranks):
        return None
    machines_of: dict[str, set] = {}
    hosts_on: dict[str, set] = {}
    for r in ranks:
        machines_of.setdefault(planned[r], set()).add(reported[r])
        hosts_on.setdefault(reported[r], set()).add(planned[r])
    if all(len(m) == 1 for m in machines_of.values()) and all(len(h) == 1 for h in hosts_on.values()):
        return None
    plan = "; ".join(f"{rank_words(rs)} on {h}" for h, rs in _groups({r: planned[r] for r in ranks}).items())
    seen = "; ".join(f"{rank_words(rs)} on {_shown(h)}" for h, rs in _groups({r: reported[r] for r in ranks}).items())
    return (
        f"the ranks do not run where the plan put them: planned {plan}; they reported {seen} "
        "(check that the hostfile's names are different machines: an ssh alias or a HostName in the ssh config "
        "can send two of them to one)"
    )
