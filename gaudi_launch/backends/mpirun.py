"""Backend ``mpirun`` (OpenMPI): one mpirun on this host starts every rank on every node.

Ranks start through gaudi_launch.worker, which maps OMPI_COMM_WORLD_* to torchrun's names.
Environment values never appear on the command line: ``-x NAME`` exports the launcher's value.
"""
from __future__ import annotations

import os
from typing import List

from gaudi_launch.errors import UserError
from gaudi_launch.plan import Command, LaunchPlan
from gaudi_launch.planner import bare_host, worker_argv
from gaudi_launch.spec import JobSpec

CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "GAUDI_LAUNCH_JOB_ID")


def commands(plan: LaunchPlan, spec: JobSpec) -> List[Command]:
    per_node = {len(n.ranks) for n in plan.nodes}
    if len(per_node) != 1:
        raise UserError("the mpirun backend needs the same number of devices on every node",
                        where="--hostfile", hint="use --num_devices N to take N devices on each node")
    k = per_node.pop()
    argv = ["mpirun"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-n", str(plan.world_size),
             "--host", ",".join(f"{bare_host(n.host)}:{k}" for n in plan.nodes),
             "--map-by", f"ppr:{k}:node", "--bind-to", "none", "--rank-by", "slot"]
    for name in sorted(set(plan.env) | set(CONTRACT)):
        argv += ["-x", name]
    argv += worker_argv(spec)
    if spec.append_local_rank:
        raise UserError("--append-local-rank is not available with mpirun: ranks read LOCAL_RANK",
                        where="--append-local-rank")
    env = {"MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.master_port),
           "GAUDI_LAUNCH_JOB_ID": plan.job_id}
    return [Command(host=plan.nodes[0].host, argv=argv, env=env)]


def run(plan: LaunchPlan, spec: JobSpec, **_):
    raise UserError("the mpirun backend is planned but cannot run yet in this version",
                    where="--backend", hint="use --dry-run to see its command, or --backend local on one host")
