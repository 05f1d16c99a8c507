"""``DistributedRunner``: optimum-habana's Python entry point, on top of our plan and supervisor.

Same constructor as upstream, plus our own keywords. Differences that matter: no shell ever sees
a command (each string is split with shlex, or pass an argv list), ``run()`` returns an int (0 on
success), ``os.environ`` is never modified, and the whole result is kept in ``self.result``.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import sys
from collections.abc import Sequence
from typing import Optional, Union

from gaudi_launch.backends import get_backend
from gaudi_launch.backends.job import launch, plan_job, prepare
from gaudi_launch.collective import apply_exclusions, check_before_job
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.options import default_of
from gaudi_launch.inputs.spec import JobSpec, job_option_fields, resolve_compat
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.process.supervise import JobResult

Command = Union[str, Sequence[str]]
# Every JobSpec option is a keyword, with the command line's default; hostfile and master_port are
# upstream's positional parameters (upstream's master_port default, 29500, stays).
_KEYWORDS = {f.name: default_of(f) for f, _ in job_option_fields() if f.name not in ("hostfile", "master_port")}
_TYPES = {f.name: f.type for f, _ in job_option_fields()}
_PYTHON = re.compile(r"python[0-9.]*$")


def command_to_program(command: Command) -> tuple:
    """'train.py --lr 1' or ['python3', 'train.py'] -> (interpreter or None, program argv). Pure."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise UserError("empty command", where="command_list")
    if _PYTHON.match(os.path.basename(argv[0])):
        if len(argv) > 1 and argv[1] == "-u":
            argv = [argv[0], *argv[2:]]
        return argv[0], argv[1:]
    return None, argv


class DistributedRunner:
    def __init__(
        self,
        command_list: Optional[list[Command]] = None,
        world_size: int = 1,
        hostfile: Optional[str] = None,
        use_mpi: bool = False,
        use_deepspeed: bool = False,
        master_port: Optional[int] = 29500,
        use_env: bool = False,
        map_by: str = "socket",
        multi_hls=None,
        *,
        stdout=None,
        stderr=None,
        **options,
    ):
        """optimum-habana's parameters, then every JobSpec option as a keyword (listed in the signature,
        with the command line's defaults), then where the ranks' output goes."""
        # use_env and map_by are accepted for compatibility: ranks always get the env contract,
        # and CPU binding is the mpirun backend's business. multi_hls is replaced by hostfile.
        for name in options:
            if name not in _KEYWORDS:
                raise TypeError(f"DistributedRunner() got an unexpected keyword argument {name!r}")
        given = {name: options.get(name, default) for name, default in _KEYWORDS.items()}
        self.command_list = list(command_list or [])
        # world_size is devices per node; the default 1 means "every slot" with a hostfile, and gives
        # way to num_devices (two different numbers are refused).
        per_node = None if (hostfile or given["num_devices"] is not None) and world_size == 1 else world_size
        backend, num_devices = resolve_compat(
            backend=given["backend"],
            use_mpi=use_mpi,
            use_deepspeed=use_deepspeed,
            world_size=per_node,
            num_devices=given["num_devices"],
        )
        given.update(
            hostfile=hostfile,
            master_port=master_port,
            num_devices=num_devices,
            backend=backend,
            env=dict(given["env"] or {}),
            export_prefixes=list(given["export_prefixes"] or []),
        )
        self.python = given.pop("python") or sys.executable
        self._template = given
        self._streams = dict(stdout=stdout, stderr=stderr)
        self.result: Optional[JobResult] = None
        self.results: list[JobResult] = []

    def spec_for(self, command: Command) -> JobSpec:
        interpreter, program = command_to_program(command)
        return JobSpec.build(program=program, python=interpreter or self.python, **self._template).validate()

    def plans(self) -> list[LaunchPlan]:
        """The plan of every command, without running anything (a dry run)."""

        return [build_plan(prepare(self.spec_for(c)), backends=get_backend) for c in self.command_list]

    def run(self) -> int:
        """Run each command as a job, in order; stop at the first failure and return its exit code.
        With max_restarts, a failed job is started again first (``self.result`` is its last attempt)."""
        self.results = []
        for command in self.command_list:
            spec, plan = prepare(self.spec_for(command)), None
            if spec.exclude_from or spec.collective_check:  # as on the command line (launch.run_spec)
                spec = apply_exclusions(spec)
                plan = plan_job(spec)
                if spec.collective_check:
                    spec, plan = check_before_job(spec, plan)
            self.result = launch(spec, plan, **self._streams)
            self.results.append(self.result)
            if not self.result.ok:
                return self.result.exit_code
        return 0


def _signature(init) -> inspect.Signature:
    """__init__'s signature with ``**options`` spelled out, so help() and editors show every keyword."""
    params = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_TYPES[name])
        for name, default in _KEYWORDS.items()
    ]
    upstream = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    return inspect.Signature(upstream + options + [p for p in params if p.kind is p.KEYWORD_ONLY])


DistributedRunner.__init__.__signature__ = _signature(DistributedRunner.__init__)  # type: ignore[attr-defined]
