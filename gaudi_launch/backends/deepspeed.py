"""Backend ``deepspeed``: the DeepSpeed launcher (pdsh or openmpi) starts gaudi_launch.worker."""
from __future__ import annotations

from typing import List, Mapping

from gaudi_launch.errors import UserError
from gaudi_launch.plan import Command, LaunchPlan
from gaudi_launch.spec import JobSpec


def commands(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str]) -> List[Command]:
    if spec.no_python:
        raise UserError("the deepspeed backend runs Python programs only", where="--no_python")
    argv = ["deepspeed", "--hostfile", "<generated from the selection>",
            "--master_addr", plan.master_addr, "--master_port", str(plan.master_port)]
    if not spec.append_local_rank:
        argv.append("--no_local_rank")
    argv += ["--module", "gaudi_launch.worker"] + (["-m"] if spec.module else []) + list(spec.program)
    return [Command(host=plan.nodes[0].host, argv=argv)]


def run(plan: LaunchPlan, spec: JobSpec, **_):
    raise UserError("the deepspeed backend is planned but cannot run yet in this version",
                    where="--backend", hint="use --dry-run to see its command, or --backend local on one host")
