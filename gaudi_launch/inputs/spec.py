"""JobSpec: what the user asked for, validated, with gaudi_spawn.py's flags mapped onto ours."""

from __future__ import annotations

import copy
import math
import sys
import typing
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, Optional, TypeVar

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import (
    AUTO,
    OWNER,
    REGISTRY,
    BackendOptions,
    SlurmOptions,
    backend_option_fields,
    capabilities,
    check_backend,
    choices,
    options_from,
    options_of,
)
from gaudi_launch.inputs.options import Option, opt, option_fields, via
from gaudi_launch.inputs.restartopts import MAX_RESTARTS, parse_restart_on
from gaudi_launch.wire import HEARTBEAT_DIR, MAX_RESTARTS_VAR, RESTART_COUNT

# Variables a job sets for its own ranks (prepare/attempt_spec), not options the user gave.
JOB_OWN_VARS = (HEARTBEAT_DIR, RESTART_COUNT, MAX_RESTARTS_VAR)
FAN_OUT_MODES = ("auto", "tree", "flat")  # plan/fanoutmode.py decides
MAX_DEVICES = 65536  # per node: far above any real host, low enough that a plan fits in memory
T = TypeVar("T", bound=BackendOptions)


MAX_GRACE_S = 3600  # the ranks' watchdog takes a grace from 0 up to (not including) this (process/worker.py _grace)


def _finite(number) -> bool:
    """math.isfinite that says False for an int too large for a float (a plan's 10**400), not OverflowError."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


@dataclass
class JobSpec:
    """What the user asked for. Each field with ``opt``/``via`` metadata is an option: a command-line
    flag (generated from it in cli.py) and a DistributedRunner keyword, with the same default."""

    program: list[str]  # the script (or module) and its arguments, untouched
    hostfile: Optional[str] = field(
        default=None,
        metadata=opt(
            "--hostfile",
            "--hostfile_path",
            help="DeepSpeed-style hostfile: 'HOST slots=N' per line. Default: this host only.",
            panel="Hosts",
        ),
    )
    include: Optional[str] = field(
        default=None,
        metadata=opt("--include", "-i", help="Use only these hosts/devices: 'host1:0,2@host2'.", panel="Hosts"),
    )
    exclude: Optional[str] = field(
        default=None,
        metadata=opt("--exclude", "-e", help="Leave out these hosts/devices: 'host1:3@host2'.", panel="Hosts"),
    )
    num_nodes: Optional[int] = field(
        default=None,
        metadata=opt("--num_nodes", "--num-nodes", help="Use the first N hosts of the hostfile.", panel="Hosts"),
    )
    num_devices: Optional[int] = field(
        default=None,
        metadata=opt(  # per node
            "--num_devices",
            "--num-devices",
            "--num_gpus",
            "--num-gpus",
            help="Devices (ranks) per node. Default: every slot, or the detected device count.",
            panel="Devices",
        ),
    )
    backend: str = field(
        default="auto",
        metadata=opt(
            "--backend",
            help=", ".join(choices()[:-1]) + f" or {choices()[-1]}. auto: slurm inside a Slurm allocation without "
            "--hostfile, local for this host alone, else mpirun.",
            panel="Hosts",
        ),
    )
    master_addr: Optional[str] = field(
        default=None,
        metadata=opt(
            "--master_addr",
            "--master-addr",
            help="Rendezvous address. Default: 127.0.0.1 locally, else the first host.",
            panel="Hosts",
        ),
    )
    master_port: Optional[int] = field(
        default=None,
        metadata=opt(
            "--master_port",
            "--master-port",
            help="Rendezvous port. Default: a free port picked on the master host.",
            panel="Hosts",
        ),
    )
    env_file: Optional[str] = field(
        default=None,
        metadata=opt(
            "--env-file",
            "--env_file",
            help="Read only this env file instead of ~/.deepspeed_env and ./.deepspeed_env.",
            panel="Environment",
        ),
    )
    env: dict[str, str] = field(
        default_factory=dict,
        metadata=opt(  # on top of the env files
            "-x",
            "--env",
            help="KEY=VALUE for every rank, or KEY to pass this shell's value without putting it on a "
            "command line (repeatable); wins over env files.",
            panel="Environment",
        ),
    )
    module: bool = field(
        default=False, metadata=opt("--module", "-m", help="Run SCRIPT as a Python module (python -m).", panel="Script")
    )
    no_python: bool = field(
        default=False,
        metadata=opt("--no_python", "--no-python", help="SCRIPT is an executable, not a Python file.", panel="Script"),
    )
    python: str = field(
        default_factory=lambda: sys.executable,
        metadata=opt("--python", help="Interpreter for the ranks. Default: this one.", panel="Script"),
    )
    append_local_rank: bool = field(
        default=False,
        metadata=opt(
            "--append-local-rank",
            "--append_local_rank",
            help="Append --local_rank=N to the script's arguments (off by default; ranks read LOCAL_RANK).",
            panel="Script",
        ),
    )
    log_dir: Optional[str] = field(
        default=None,
        metadata=opt(
            "--log-dir", "--log_dir", help="Also write each rank's output to DIR/rank-N.log.", panel="Output and modes"
        ),
    )
    grace: float = field(
        default=10.0,
        metadata=opt(
            "--grace", help="Seconds between SIGTERM and SIGKILL when tearing the job down.", panel="Long runs"
        ),
    )
    # Multi-node: SSH, pre-flight, exported environment, fabric.
    ssh_port: Optional[int] = field(
        default=None,
        metadata=opt(
            "--ssh-port",
            "--ssh_port",
            help="SSH port of every host. Default: ~/.ssh/config, else 22 (DL1 containers: 3022).",
            panel="SSH",
        ),
    )
    ssh_identity: Optional[str] = field(
        default=None,
        metadata=opt(
            "--ssh-identity",
            "--ssh_identity",
            help="Private key for SSH. Default: ~/.ssh/config, then the usual keys and the agent.",
            panel="SSH",
        ),
    )
    ssh_config: Optional[str] = field(
        default=None,
        metadata=opt(
            "--ssh-config",
            "--ssh_config",
            help="ssh_config file, read alone (as ssh -F). Default: ~/.ssh/config, then /etc/ssh/ssh_config.",
            panel="SSH",
        ),
    )
    ssh_timeout: float = field(
        default=10.0,
        metadata=opt("--ssh-timeout", "--ssh_timeout", help="SSH connect timeout in seconds.", panel="SSH"),
    )
    strict_host_keys: bool = field(
        default=False,
        metadata=opt(
            "--strict-host-keys",
            help="Refuse hosts whose key is not in known_hosts (default: accept new keys, refuse changed ones).",
            panel="SSH",
        ),
    )
    ssh_check: bool = field(default=True, metadata=via("--no-ssh-check"))
    wait_hosts: Optional[float] = field(
        default=None,
        metadata=opt(
            "--wait-hosts",
            "--wait_hosts",
            help="Wait up to S seconds for every host's sshd to answer before the "
            "pre-flight (hosts that start with the job, e.g. containers).",
            panel="SSH",
        ),
    )
    fan_out: str = field(
        default="auto",
        metadata=opt(
            "--fan-out",
            "--fan_out",
            help="How the pre-flight and mpirun's daemons reach the hosts: flat, one ssh per host from here; tree, "
            "through OpenMPI's own daemon tree (mpirun backend, OpenMPI 4); auto: flat for a few hosts, tree for "
            "many. Default: auto.",
            panel="SSH",
        ),
    )
    export_prefixes: list[str] = field(
        default_factory=list,
        metadata=opt(
            "--export-prefix",
            "--export_prefix",
            help="Also export this launcher's variables starting with PREFIX to every rank (repeatable).",
            panel="Environment",
        ),
    )
    efa: Optional[bool] = field(
        default=None,
        metadata=opt(  # None: decided per host (plan/scaleout.py, plan/fabric.py)
            "--efa/--no-efa",
            help="First-generation Gaudi (AWS DL1) only: set HCCL_OVER_OFI and the EFA libraries. Ignored on "
            "Gaudi 2 and 3, whose HCCL chooses its own path and takes no EFA. Default: where the hosts are DL1.",
            panel="Environment",
        ),
    )
    hccl_ofi_wrapper: Optional[str] = field(
        default=None,
        metadata=opt(
            "--hccl-ofi-wrapper",
            "--hccl_ofi_wrapper",
            help="Directory of hccl_ofi_wrapper. Default: $HCCL_OFI_WRAPPER, else /root/hccl_ofi_wrapper.",
            panel="Environment",
        ),
    )
    cpu_bind: str = field(
        default="numa",
        metadata=opt(  # plan/gaudi.py; the rank bootstrap binds
            "--cpu-bind",
            "--cpu_bind",
            help="numa: bind each rank to its share of the cores of its Gaudi card's NUMA node (from hl-smi's bus "
            "id and sysfs); none: leave ranks unbound. Default: numa.",
            panel="Devices",
        ),
    )
    # DeepSpeed's and Slurm's options (backend_options.py), of the one backend they were given for:
    # None is every backend's defaults. Read them with spec.options(SlurmOptions); JobSpec.build takes them flat.
    backend_options: Optional[BackendOptions] = None
    # show only these ranks on the console (logs keep all)
    console_ranks: Optional[list[int]] = field(default=None, metadata=via("--ranks"))
    # Long runs (restarts.py): start a failed job again, up to max_restarts times.
    max_restarts: int = field(
        default=0,
        metadata=opt(
            "--max-restarts",
            "--max_restarts",
            help="Start the job again after a failure, up to N times (torchrun's option); ranks get "
            "GAUDI_LAUNCH_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT, our Trainer resumes from its newest "
            "checkpoint.",
            panel="Long runs",
        ),
    )
    restart_on: str = field(
        default="all",
        metadata=opt(
            "--restart-on",
            "--restart_on",
            help="With --max-restarts: which failures restart, a list of rank, host, hang (default all).",
            panel="Long runs",
        ),
    )
    restart_backoff: float = field(
        default=1.0,
        metadata=opt(
            "--restart-backoff",
            "--restart_backoff",
            help="With --max-restarts: seconds before the first restart, doubling after each (at most 60).",
            panel="Long runs",
        ),
    )
    spare_hosts: int = field(
        default=0,
        metadata=opt(
            "--spare-hosts",
            "--spare_hosts",
            help="With --max-restarts: hold the last N selected hosts back; one takes a lost host's place on the "
            "restart, so the world size stays.",
            panel="Long runs",
        ),
    )
    min_nodes: Optional[int] = field(
        default=None,
        metadata=opt(
            "--min-nodes",
            "--min_nodes",
            help="With --max-restarts: when a host is lost and no spare is left, restart on the hosts left if there "
            "are at least M (else exit 4).",
            panel="Long runs",
        ),
    )
    hang_timeout: Optional[float] = field(
        default=None,
        metadata=opt(  # hangs.py
            "--hang-timeout",
            "--hang_timeout",
            help="When no rank on this host advanced for S seconds (heartbeats: our Trainer's steps, "
            "gaudi_launch.heartbeat() in a script), print where every rank waits, keep their stacks in "
            "--log-dir, and tear the job down (exit 5). Default: off.",
            panel="Long runs",
        ),
    )
    start_timeout: Optional[float] = field(
        default=None,
        metadata=opt(  # supervise.py; the default is launch.start_timeout_for's
            "--start-timeout",
            "--start_timeout",
            help="Fail the launch (exit 127) when not every rank has started within S seconds, saying which "
            "did and where; 0: never. Default: 900, never with --backend slurm (srun may wait in the queue).",
            panel="Long runs",
        ),
    )
    # Issue 25 (collective.py): prove the fabric before the job.
    collective_check: bool = field(
        default=False,
        metadata=opt(
            "--collective-check",
            "--collective_check",
            "--collective",
            help="Before the job (or with `check`): an all-reduce and ring exchanges, one rank per host through the "
            "job's backend; slow or failed hosts are named (exit 3), or replaced by --spare-hosts.",
            panel="Hosts",
        ),
    )
    min_bandwidth: Optional[float] = field(
        default=None,
        metadata=opt(
            "--min-bandwidth",
            "--min_bandwidth",
            help="With --collective-check: a host under this many GB/s with its best partner is slow (besides "
            "under a quarter of the median).",
            panel="Hosts",
        ),
    )
    exclude_from: Optional[str] = field(
        default=None,
        metadata=opt(
            "--exclude-from",
            "--exclude_from",
            help="Leave out the hosts a collective check found slow or failed (its collective-check.json).",
            panel="Hosts",
        ),
    )
    allow_version_mismatch: bool = field(
        default=False,
        metadata=opt(
            "--allow-version-mismatch",
            "--allow_version_mismatch",
            help="Go on when Python, torch, the Gaudi bridge, DeepSpeed, transformers, OpenMPI, the Gaudi driver "
            "or firmware differ across hosts, or a host's driver is not of its bridge's release (the pre-flight "
            "shows them as warnings instead of failing).",
            panel="SSH",
        ),
    )
    allow_partial_nodes: bool = field(
        default=False,
        metadata=opt(
            "--allow-partial-nodes",
            "--allow_partial_nodes",
            help="Go on when a job of several hosts uses only some of a host's Gaudi cards (Habana's "
            "'Gaudi-to-process Assignment': in scale-out every Gaudi of the server takes part; the pre-flight "
            "warns instead of failing).",
            panel="SSH",
        ),
    )
    lost_hosts: list[str] = field(default_factory=list)  # set by the restart loop, not an option

    @classmethod
    def build(cls, **values: Any) -> JobSpec:
        """A JobSpec from flat option values (the command line's, a job file's, DistributedRunner's keywords, a
        saved plan's request): the backends' options go into the one object of their backend. Options of a
        backend given with another --backend raise a UserError naming both."""
        flat = {name: values.pop(name) for name in list(values) if name in OWNER}
        values["backend_options"] = options_from(values.get("backend") or "auto", flat)
        return cls(**values)

    def options(self, cls: type[T]) -> T:
        """The options of one backend (backend_options.py): those given for it, else its defaults."""
        return options_of(self.backend_options, cls)

    def as_request(self, cwd: str) -> dict:
        """What the user asked for, as plain JSON values: the options, without what a job adds to
        its own environment (restart count, heartbeat directory), and where (``cwd``). Pure."""
        request: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "backend_options":  # flat, as the user gave them (JobSpec.build reads them so)
                for cls in REGISTRY.values():
                    request.update(asdict(self.options(cls)))
            else:
                request[f.name] = copy.deepcopy(getattr(self, f.name))
        request["env"] = {k: v for k, v in self.env.items() if k not in JOB_OWN_VARS}
        request["cwd"] = cwd
        return request

    def validate(self, require_program: bool = True) -> JobSpec:
        if require_program and not self.program:
            raise UserError(
                "no training script given", where="SCRIPT", hint="gaudi-launch [OPTIONS] train.py [SCRIPT ARGS]..."
            )
        if self.module and self.no_python:
            raise UserError("--module and --no_python cannot be used together", where="--module")
        if self.backend != AUTO:
            capabilities(self.backend)  # an unknown name: a UserError naming the choices
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
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not _finite(seconds):
                raise UserError(f"must be a finite number of seconds, got {seconds!r}", where=option)
        if self.wait_hosts is not None and (
            not isinstance(self.wait_hosts, (int, float)) or not _finite(self.wait_hosts) or self.wait_hosts <= 0
        ):
            raise UserError(f"must be a positive number of seconds, got {self.wait_hosts!r}", where="--wait-hosts")
        if self.wait_hosts is not None and not self.ssh_check:
            raise UserError(
                "--wait-hosts waits before the pre-flight, which --no-ssh-check turns off",
                where="--wait-hosts",
                hint="drop one of them",
            )
        if self.ssh_timeout <= 0:
            raise UserError(f"must be positive, got {self.ssh_timeout}", where="--ssh-timeout")
        if self.fan_out not in FAN_OUT_MODES:
            raise UserError(f"unknown fan-out {self.fan_out!r}", where="--fan-out", hint=", ".join(FAN_OUT_MODES))
        if self.cpu_bind not in ("numa", "none"):
            raise UserError(f"unknown CPU binding {self.cpu_bind!r}", where="--cpu-bind", hint="numa or none")
        if self.backend_options is not None:
            self.backend_options.validate()
            if self.backend != AUTO:  # auto: once it has chosen (the planner)
                check_backend(self.backend_options, self.backend)
        if self.grace < 0:
            raise UserError(f"must not be negative, got {self.grace}", where="--grace")
        if self.grace >= MAX_GRACE_S:  # each rank's watchdog (process/worker.py _grace) would take 10 s instead
            raise UserError(
                f"at most {MAX_GRACE_S - 1} seconds, got {self.grace:g}",
                where="--grace",
                hint="the ranks' own watchdog uses the same grace and takes no larger one",
            )
        bw = self.min_bandwidth
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < math.inf):
            raise UserError(f"a positive number of GB/s, got {bw!r}", where="--min-bandwidth")
        # (under Slurm, and auto inside an allocation, the allocation's nodes are the hosts)
        scheduled = self.backend == AUTO or capabilities(self.backend).scheduler
        if self.collective_check and not self.hostfile and not scheduled:
            raise UserError(
                "the collective check measures the links between hosts: give a --hostfile", where="--collective-check"
            )
        self._validate_restarts()
        return self

    def _validate_restarts(self) -> None:
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or not 0 <= self.max_restarts <= MAX_RESTARTS
        ):
            raise UserError(
                f"a whole number from 0 to {MAX_RESTARTS}, got {self.max_restarts!r}", where="--max-restarts"
            )
        parse_restart_on(self.restart_on)
        if self.max_restarts and self.options(SlurmOptions).sbatch:
            raise UserError(
                "the batch script --sbatch writes runs the job once",
                where="--max-restarts",
                hint="leave --max-restarts out, or run gaudi-launch --max-restarts N inside an allocation",
            )
        backoff = self.restart_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not _finite(backoff) or backoff < 0:
            raise UserError(f"a number of seconds, 0 or more, got {backoff!r}", where="--restart-backoff")
        hang = self.hang_timeout
        if hang is not None and (
            isinstance(hang, bool) or not isinstance(hang, (int, float)) or not _finite(hang) or hang < 1
        ):
            raise UserError(f"a number of seconds, at least 1, got {hang!r}", where="--hang-timeout")
        start = self.start_timeout
        if start is not None and (
            isinstance(start, bool) or not isinstance(start, (int, float)) or not _finite(start) or start < 0
        ):
            raise UserError(f"a number of seconds, 0 (never) or more, got {start!r}", where="--start-timeout")
        for option, value in (("--spare-hosts", self.spare_hosts), ("--min-nodes", self.min_nodes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UserError(f"a whole number, 0 or more, got {value!r}", where=option)
        if (self.spare_hosts or self.min_nodes) and not self.hostfile:
            raise UserError(
                "spare hosts and smaller restarts are for several hosts: give a --hostfile",
                where="--spare-hosts" if self.spare_hosts else "--min-nodes",
            )
        if (self.spare_hosts or self.min_nodes) and not self.max_restarts:
            raise UserError(
                "a lost host is replaced on a restart: add --max-restarts N",
                where="--spare-hosts" if self.spare_hosts else "--min-nodes",
            )


def job_option_fields() -> list[tuple[Field, Option]]:
    """Every option a JobSpec takes, flat: its own, then its backends' (backend_options.py)."""
    return option_fields(JobSpec) + [(f, o) for _, f, o in backend_option_fields()]


def option_types() -> dict[str, Any]:
    """The type of every option a JobSpec takes (flat, as job_option_fields gives them), resolved."""
    hints = typing.get_type_hints(JobSpec)
    for cls in REGISTRY.values():
        hints.update(typing.get_type_hints(cls))
    return hints


def resolve_compat(
    *, backend: str, use_mpi: bool, use_deepspeed: bool, world_size: Optional[int], num_devices: Optional[int]
) -> tuple:
    """Map gaudi_spawn.py's --use_mpi/--use_deepspeed/--world_size onto (backend, num_devices)."""
    if use_mpi and use_deepspeed:
        raise UserError("--use_mpi and --use_deepspeed cannot be used together", where="--use_mpi")
    wanted = "mpirun" if use_mpi else "deepspeed" if use_deepspeed else None
    if wanted:
        if backend not in (AUTO, wanted):
            flag = "--use_mpi" if use_mpi else "--use_deepspeed"
            raise UserError(f"{flag} contradicts --backend {backend}", where=flag)
        backend = wanted
    if world_size is not None:
        if world_size < 1:
            raise UserError(f"must be at least 1, got {world_size}", where="--world_size")
        if num_devices is not None and num_devices != world_size:
            raise UserError(
                f"--world_size {world_size} contradicts --num_devices {num_devices}",
                where="--world_size",
                hint="--world_size is gaudi_spawn.py's name for devices per node; give one of them",
            )
        num_devices = world_size
    return backend, num_devices
