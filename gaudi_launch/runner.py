"""``DistributedRunner``: optimum-habana's Python entry point, on top of our plan and supervisor.

Same constructor as upstream, plus our own keywords. Differences that matter: no shell ever sees
a command (each string is split with shlex, or pass an argv list), ``run()`` returns an int (0 on
success), ``os.environ`` is never modified, and the whole result is kept in ``self.result``.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Dict, List, Optional, Sequence, Union

from gaudi_launch.errors import UserError
from gaudi_launch.plan import LaunchPlan
from gaudi_launch.spec import JobSpec, resolve_compat
from gaudi_launch.supervise import JobResult

Command = Union[str, Sequence[str]]
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
    def __init__(self, command_list: Optional[List[Command]] = None, world_size: int = 1,
                 hostfile: Optional[str] = None, use_mpi: bool = False, use_deepspeed: bool = False,
                 master_port: Optional[int] = 29500, use_env: bool = False, map_by: str = "socket",
                 multi_hls=None, *, backend: str = "auto", include: Optional[str] = None,
                 exclude: Optional[str] = None, num_nodes: Optional[int] = None,
                 env: Optional[Dict[str, str]] = None, env_file: Optional[str] = None,
                 master_addr: Optional[str] = None, log_dir: Optional[str] = None, grace: float = 10.0,
                 append_local_rank: bool = False, python: Optional[str] = None,
                 ssh_port: Optional[int] = None, ssh_identity: Optional[str] = None,
                 ssh_config: Optional[str] = None, ssh_check: bool = True, efa: Optional[bool] = None,
                 launcher: str = "pdsh", max_restarts: int = 0, restart_on: str = "all",
                 restart_backoff: float = 1.0, hang_timeout: Optional[float] = None, spare_hosts: int = 0,
                 min_nodes: Optional[int] = None, stdout=None, stderr=None):
        # use_env and map_by are accepted for compatibility: ranks always get the env contract,
        # and CPU binding is the mpirun backend's business. multi_hls is replaced by hostfile.
        self.command_list = list(command_list or [])
        # world_size is devices per node; with a hostfile the default 1 means "every slot".
        per_node = None if hostfile and world_size == 1 else world_size
        backend, num_devices = resolve_compat(backend=backend, use_mpi=use_mpi, use_deepspeed=use_deepspeed,
                                              world_size=per_node, num_devices=None)
        self._template = dict(
            hostfile=hostfile, include=include, exclude=exclude, num_nodes=num_nodes,
            num_devices=num_devices, backend=backend, master_addr=master_addr, master_port=master_port,
            env_file=env_file, env=dict(env or {}), append_local_rank=append_local_rank,
            log_dir=log_dir, grace=grace, ssh_port=ssh_port, ssh_identity=ssh_identity,
            ssh_config=ssh_config, ssh_check=ssh_check, efa=efa, launcher=launcher,
            max_restarts=max_restarts, restart_on=restart_on, restart_backoff=restart_backoff,
            hang_timeout=hang_timeout, spare_hosts=spare_hosts, min_nodes=min_nodes)
        self.python = python or sys.executable
        self._streams = dict(stdout=stdout, stderr=stderr)
        self.result: Optional[JobResult] = None
        self.results: List[JobResult] = []

    def spec_for(self, command: Command) -> JobSpec:
        interpreter, program = command_to_program(command)
        return JobSpec(program=program, python=interpreter or self.python, **self._template).validate()

    def plans(self) -> List[LaunchPlan]:
        """The plan of every command, without running anything (a dry run)."""
        from gaudi_launch.launch import prepare
        from gaudi_launch.planner import build_plan

        return [build_plan(prepare(self.spec_for(c))) for c in self.command_list]

    def run(self) -> int:
        """Run each command as a job, in order; stop at the first failure and return its exit code.
        With max_restarts, a failed job is started again first (``self.result`` is its last attempt)."""
        from gaudi_launch.launch import launch

        self.results = []
        for command in self.command_list:
            self.result = launch(self.spec_for(command), **self._streams)
            self.results.append(self.result)
            if not self.result.ok:
                return self.result.exit_code
        return 0
