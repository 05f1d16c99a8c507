"""Which hosts an attempt of a restarted job runs on (--spare-hosts, --min-nodes, hosts lost so far). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode


class HostsExhausted(UserError):
    """Lost hosts leave too few to go on: the job stops as a lost host does (exit 4)."""

    exit_code = ExitCode.HOST_LOST


def hosts_for_attempt(
    selected: list[tuple[str, list]], lost: Sequence[str], spares: int, min_nodes: Optional[int]
) -> tuple[list[tuple[str, list]], Optional[str]]:
    """Which selected (host, devices) run this attempt, and a note. The last ``spares`` hosts are
    held back; a lost host is left out and the next spare takes its place, so the world size stays.
    Without a spare the job runs on fewer hosts only down to ``min_nodes``. Pure."""
    if spares and spares >= len(selected):
        raise UserError(
            f"{spares} spare host(s) leave none of the {len(selected)} selected to run on",
            where="--spare-hosts",
            hint="list more hosts than --spare-hosts",
        )
    wanted = len(selected) - spares
    usable = [s for s in selected if s[0] not in set(lost)]
    if len(usable) >= wanted:
        chosen = usable[:wanted]
    elif min_nodes and len(usable) >= min_nodes:
        chosen = usable
    else:
        raise HostsExhausted(
            f"{len(lost)} host(s) lost ({', '.join(lost)}): {len(usable)} left, the job needs {min_nodes or wanted}",
            where="--max-restarts",
            hint="--spare-hosts N holds hosts back to take a lost one's place; --min-nodes M lets "
            "the job go on with fewer",
        )
    notes = []
    held = [h for h, _ in usable[len(chosen) :]]
    if held:
        notes.append("spare host(s) held back: " + ", ".join(held))
    if lost:
        notes.append("left out (lost in an earlier attempt): " + ", ".join(lost))
    if len(chosen) < wanted:
        notes.append(
            f"running on {len(chosen)} of {wanted} host(s) (--min-nodes {min_nodes}): fewer ranks, so a "
            "smaller global batch unless the script adapts to WORLD_SIZE"
        )
    return chosen, "; ".join(notes) or None
