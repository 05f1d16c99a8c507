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
from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.spec import FAN_OUT_MODES
from gaudi_launch.wire import TREE_PASSES, TREE_RADIX

MODES = FAN_OUT_MODES

# auto: the flat path below this many remote hosts, the tree from it up. Where the two cross:
# scripts/bench/bench_scale.py's model (docs/performance.md "Launch cost against hosts"), every host its own
# machine. The tree in one pass (remote/onepass.py): 175 hosts with the costs measured on a quiet machine, 174
# under load (2026-12-02); on the namespace cluster it was level with flat at 16 and 32 hosts and faster at 64.
# Where the tree must run its three passes (pre-flight, start, sweep: spares, --wait-hosts, the collective
# check, a user's rsh agent, GAUDI_LAUNCH_TREE_PASSES=3): 485 quiet, 540 under load; below that they cost more
# than flat's CPU per host saves (the namespace cluster: slower at 16, 32 and 64 hosts alike).
ONE_PASS_FROM_HOSTS = 175
TREE_FROM_HOSTS = 500

# The tree's radix: OpenMPI's own (routed_radix, 64) unless this variable names another (tests use 2, so a tree
# of a few hosts has depth 2).
RADIX_ENV = TREE_RADIX
# mpirun's rsh agent, set by the user (also under its older names): theirs to keep, so the tree's hops are theirs
# (no tree hop of ours, no session to watch)
USER_RSH_AGENT = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent", "OMPI_MCA_pls_rsh_agent")


def choose(requested: str, remote_hosts: int, tree_possible: bool, one_pass: bool = False) -> str:
    """ "tree" or "flat" for ``requested`` (MODES) with this many remote hosts. ``tree_possible``: the backend
    starts its ranks with OpenMPI 4's mpirun from here (the one engine wired so far); ``one_pass``: the tree
    would go in one pass (``one_pass_possible``), so auto takes it from fewer hosts. Pure."""
    if requested == "flat" or not tree_possible or remote_hosts == 0:
        return "flat"
    if requested == "tree":
        return "tree"
    return "tree" if remote_hosts >= (ONE_PASS_FROM_HOSTS if one_pass else TREE_FROM_HOSTS) else "flat"


def one_pass_asked(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(TREE_PASSES, "1").strip() != "3"


def one_pass_possible(plan, spec, environ: Mapping[str, str] = os.environ) -> bool:
    """The tree would go in one pass (remote/onepass.py): the mpirun backend's daemon tree to remote hosts, no
    spare host (not in the job's mpirun), no --wait-hosts nor collective check (both want the pre-flight before
    the job), no rsh agent of the user's, not asked off (GAUDI_LAUNCH_TREE_PASSES=3). Pure."""
    remote = [n.host for n in plan.nodes if not is_local_host(n.host)]
    if not capabilities(plan.backend).daemon_tree or not remote or plan.spares or not one_pass_asked(environ):
        return False
    if spec.wait_hosts or spec.collective_check:
        return False
    return not any(environ.get(name) for name in USER_RSH_AGENT)


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
