"""JobSpec: what the user asked for, validated, with gaudi_spawn.py's flags mapped onto ours."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from gaudi_launch.errors import UserError

BACKENDS = ("auto", "local", "mpirun", "deepspeed", "slurm")
MAX_DEVICES = 65536  # per node: far above any real host, low enough that a plan fits in memory


@dataclass
class JobSpec:
    program: List[str]                   # the script (or module) and its arguments, untouched
    module: bool = False                 # run program[0] as a module (python -m)
    no_python: bool = False              # program[0] is an executable, not a Python script
    python: str = field(default_factory=lambda: sys.executable)
    hostfile: Optional[str] = None
    include: Optional[str] = None
    exclude: Optional[str] = None
    num_nodes: Optional[int] = None
    num_devices: Optional[int] = None    # per node
    backend: str = "auto"
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    env_file: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)  # from -x, on top of the env files
    append_local_rank: bool = False
    log_dir: Optional[str] = None
    grace: float = 10.0
    # Multi-node: SSH, pre-flight, exported environment, fabric, DeepSpeed's own launcher.
    ssh_port: Optional[int] = None
    ssh_identity: Optional[str] = None
    ssh_config: Optional[str] = None
    ssh_timeout: float = 10.0
    strict_host_keys: bool = False
    ssh_check: bool = True
    wait_hosts: Optional[float] = None    # seconds to wait for every host's sshd before the pre-flight
    export_prefixes: List[str] = field(default_factory=list)
    efa: Optional[bool] = None             # None: on when this host has EFA devices
    hccl_ofi_wrapper: Optional[str] = None
    launcher: str = "pdsh"                 # DeepSpeed's multi-node runner: pdsh or openmpi
    launcher_args: Optional[str] = None
    # Slurm (--backend slurm from a login node): srun's allocation options, and the user's own.
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    slurm_args: Optional[str] = None
    sbatch: Optional[str] = None           # write a batch script for this job instead of running it
    console_ranks: Optional[List[int]] = None  # show only these ranks on the console (logs keep all)
    # Long runs (restarts.py): start a failed job again, up to max_restarts times.
    max_restarts: int = 0
    restart_on: str = "rank,host,hang"     # which failures restart: rank failure, lost host, hang
    restart_backoff: float = 1.0           # seconds before the first restart, doubling after each
    hang_timeout: Optional[float] = None   # seconds without any rank's heartbeat: the job hung (hangs.py)
    spare_hosts: int = 0                   # the last N selected hosts wait to replace a lost one
    min_nodes: Optional[int] = None        # without a spare, go on with at least this many hosts
    lost_hosts: List[str] = field(default_factory=list)  # set by the restart loop, not an option

    def validate(self, require_program: bool = True) -> "JobSpec":
        if require_program and not self.program:
            raise UserError("no training script given", where="SCRIPT",
                            hint="gaudi-launch [OPTIONS] train.py [SCRIPT ARGS]...")
        if self.module and self.no_python:
            raise UserError("--module and --no_python cannot be used together", where="--module")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}", where="--backend",
                            hint="one of: " + ", ".join(BACKENDS))
        for option, value in (("--num_nodes", self.num_nodes), ("--num_devices", self.num_devices)):
            if value is not None and value < 1:
                raise UserError(f"must be at least 1, got {value}", where=option)
        if self.num_devices is not None and self.num_devices > MAX_DEVICES:
            raise UserError(f"{self.num_devices} devices per node is more than {MAX_DEVICES}", where="--num_devices")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise UserError(f"port {self.master_port} is out of range 1-65535", where="--master_port")
        if self.ssh_port is not None and not 1 <= self.ssh_port <= 65535:
            raise UserError(f"port {self.ssh_port} is out of range 1-65535", where="--ssh-port")
        # nan compares false with everything: without isfinite it slips past every bound below
        # (--grace nan busy-looped and never sent SIGKILL).
        for option, seconds in (("--ssh-timeout", self.ssh_timeout), ("--grace", self.grace)):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
                raise UserError(f"must be a finite number of seconds, got {seconds!r}", where=option)
        if self.wait_hosts is not None and (not isinstance(self.wait_hosts, (int, float))
                                            or not math.isfinite(self.wait_hosts) or self.wait_hosts <= 0):
            raise UserError(f"must be a positive number of seconds, got {self.wait_hosts!r}", where="--wait-hosts")
        if self.wait_hosts is not None and not self.ssh_check:
            raise UserError("--wait-hosts waits before the pre-flight, which --no-ssh-check turns off",
                            where="--wait-hosts", hint="drop one of them")
        if self.ssh_timeout <= 0:
            raise UserError(f"must be positive, got {self.ssh_timeout}", where="--ssh-timeout")
        if self.launcher not in ("pdsh", "openmpi"):
            raise UserError(f"unknown DeepSpeed launcher {self.launcher!r}", where="--launcher",
                            hint="pdsh or openmpi")
        if self.grace < 0:
            raise UserError(f"must not be negative, got {self.grace}", where="--grace")
        self._validate_restarts()
        return self

    def _validate_restarts(self) -> None:
        from gaudi_launch.restarts import MAX_RESTARTS, parse_restart_on

        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) \
                or not 0 <= self.max_restarts <= MAX_RESTARTS:
            raise UserError(f"a whole number from 0 to {MAX_RESTARTS}, got {self.max_restarts!r}",
                            where="--max-restarts")
        parse_restart_on(self.restart_on)
        if self.max_restarts and self.sbatch:
            raise UserError("the batch script --sbatch writes runs the job once", where="--max-restarts",
                            hint="leave --max-restarts out, or run gaudi-launch --max-restarts N inside an allocation")
        backoff = self.restart_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not math.isfinite(backoff) \
                or backoff < 0:
            raise UserError(f"a number of seconds, 0 or more, got {backoff!r}", where="--restart-backoff")
        hang = self.hang_timeout
        if hang is not None and (isinstance(hang, bool) or not isinstance(hang, (int, float))
                                 or not math.isfinite(hang) or hang < 1):
            raise UserError(f"a number of seconds, at least 1, got {hang!r}", where="--hang-timeout")
        for option, value in (("--spare-hosts", self.spare_hosts), ("--min-nodes", self.min_nodes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UserError(f"a whole number, 0 or more, got {value!r}", where=option)
        if (self.spare_hosts or self.min_nodes) and not self.hostfile:
            raise UserError("spare hosts and smaller restarts are for several hosts: give a --hostfile",
                            where="--spare-hosts" if self.spare_hosts else "--min-nodes")
        if (self.spare_hosts or self.min_nodes) and not self.max_restarts:
            raise UserError("a lost host is replaced on a restart: add --max-restarts N",
                            where="--spare-hosts" if self.spare_hosts else "--min-nodes")


def resolve_compat(*, backend: str, use_mpi: bool, use_deepspeed: bool,
                   world_size: Optional[int], num_devices: Optional[int]) -> tuple:
    """Map gaudi_spawn.py's --use_mpi/--use_deepspeed/--world_size onto (backend, num_devices)."""
    if use_mpi and use_deepspeed:
        raise UserError("--use_mpi and --use_deepspeed cannot be used together", where="--use_mpi")
    wanted = "mpirun" if use_mpi else "deepspeed" if use_deepspeed else None
    if wanted:
        if backend not in ("auto", wanted):
            flag = "--use_mpi" if use_mpi else "--use_deepspeed"
            raise UserError(f"{flag} contradicts --backend {backend}", where=flag)
        backend = wanted
    if world_size is not None:
        if world_size < 1:
            raise UserError(f"must be at least 1, got {world_size}", where="--world_size")
        if num_devices is not None and num_devices != world_size:
            raise UserError(f"--world_size {world_size} contradicts --num_devices {num_devices}",
                            where="--world_size",
                            hint="--world_size is gaudi_spawn.py's name for devices per node; give one of them")
        num_devices = world_size
    return backend, num_devices
