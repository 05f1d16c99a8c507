"""How the launcher reaches many hosts (issue 34): ``flat``, one ssh per host from this host (the pre-flight's
connections, shared with mpirun's daemons and the sweep: remote/sshmux.py), or ``tree``, through OpenMPI's own
daemon tree (the job's mpirun keeps its tree spawn; its ranks run the pre-flight's probe before the launcher's
go and sweep their hosts at the end, remote/onepass.py; with GAUDI_LAUNCH_TREE_PASSES=3 the probe and the sweep
are an mpirun each, remote/treeprobe.py). Pure decisions; the I/O is in remote/.

Why OpenMPI's tree for the mpirun backend: it is what such a cluster already runs (mpirun starts its daemons that
way, radix 64, unless told not to), so the tree's hops log in exactly as raw mpirun's do (docs/security.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import FAN_OUT_MODES
from gaudi_launch.wire import TREE_RADIX

MODES = FAN_OUT_MODES

# auto: the flat path below this many remote hosts, the tree from it up. Where the two cross:
# scripts/bench/bench_scale.py's model (docs/performance.md "Launch cost against hosts"), every host its own
# machine: 485 hosts with the costs measured on a quiet machine, 540 under load (2026-12-02). Below it the tree's
# three passes (pre-flight, start, sweep) cost more than flat's CPU per host saves; on the namespace cluster,
# where every host shares the launcher's cores, the tree was slower at 16, 32 and 64 hosts alike.
TREE_FROM_HOSTS = 500

# The tree's radix: OpenMPI's own (routed_radix, 64) unless this variable names another (tests use 2, so a tree
# of a few hosts has depth 2).
RADIX_ENV = TREE_RADIX


def choose(requested: str, remote_hosts: int, tree_possible: bool) -> str:
    """ "tree" or "flat" for ``requested`` (MODES) with this many remote hosts. ``tree_possible``: the backend
    starts its ranks with OpenMPI 4's mpirun from here (the one engine wired so far). Pure."""
    if requested == "flat" or not tree_possible or remote_hosts == 0:
        return "flat"
    if requested == "tree":
        return "tree"
    return "tree" if remote_hosts >= TREE_FROM_HOSTS else "flat"


def radix(environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """The radix asked for in RADIX_ENV (>= 1), or None for OpenMPI's own. A bad value is an error. Pure."""
    text = environ.get(RADIX_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UserError(
            f"{RADIX_ENV}={text!r} is not a whole number >= 1", where=RADIX_ENV, hint="unset it, or give 64"
        )
    return int(text)


def depth(hosts: int, radix_: Optional[int]) -> int:
    """Levels of ssh hops below mpirun for ``hosts`` daemons in a radix tree (OpenMPI's routed radix: the
    launcher's children are vpids 1..r, theirs r+1..): 1 for up to r hosts. Pure."""
    r = radix_ or 64
    levels, reach, width = 0, 0, 1
    while reach < hosts:
        width *= r
        reach += width
        levels += 1
    return levels
