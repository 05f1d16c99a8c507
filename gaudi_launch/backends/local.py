"""Backend ``local``: one process per selected device on this host, owned by the supervisor."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

from gaudi_launch.plan.contract import node_visibility_env, rank_contract, worker_argv
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import Command, LaunchPlan
from gaudi_launch.remote.hostprobe import facts_here
from gaudi_launch.remote.teardown import job_sweeper

if TYPE_CHECKING:  # types only
    from gaudi_launch.process.supervise import JobResult


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, HostFacts]:
    """This host's facts, read by the probe every host gets, run here (remote/hostprobe.py)."""
    return facts_here(plan)


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    spec = plan.job
    out = []
    base = worker_argv(spec)
    # Device ids index what the ranks would inherit: the launcher's environment, then the job's.
    inherited = {**environ, **plan.env}
    for node in plan.nodes:
        node_env = node_visibility_env(node, inherited)  # once per node: planning stays linear in ranks
        for local_rank, rank in enumerate(node.ranks):
            argv = base + ([f"--local_rank={local_rank}"] if spec.append_local_rank else [])
            env = rank_contract(plan, node, local_rank, inherited, node_env)
            out.append(Command(host=node.host, argv=argv, env=env, rank=rank))
    return out


def run(plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options) -> JobResult:
    # The supervisor loads when a job starts: a dry run plans with detect() and commands() alone (issue 37)
    from gaudi_launch.process.supervise import Hooks, ProcSpec, supervise_job

    environ = os.environ if environ is None else environ
    # Each rank's whole environment: the launcher's, then the job's, then its own contract; ``commands``
    # above made one command per rank, each with its rank, in rank order.
    procs = [
        ProcSpec(rank=i if c.rank is None else c.rank, host=c.host, argv=c.argv, env={**environ, **plan.env, **c.env})
        for i, c in enumerate(plan.commands)
    ]
    # A rank's daemon (setsid, double fork) leaves its process group but keeps the job id.
    # A rank's `sudo -u` child left in the rank's session after the rank exited is the job's too.
    sessions: set[int] = set()
    sweep = job_sweeper(
        ["localhost"], plan.job_id, ssh_args=[], python=sys.executable, is_local=lambda _: True, groups=sessions
    )
    return supervise_job(plan, procs, Hooks(sweep=sweep, sessions=sessions), **supervisor_options)
