"""The backend registry: what each backend can do (``Capabilities``, as torchx's scheduler registry) and the
options that belong to it (as torchx's runopts: DeepSpeed's runner, srun's allocation and the batch script).
The core (planner, pre-flight, hang watch, the command line) asks a backend's capabilities, never its name:
a new backend is a module in gaudi_launch/backends/ and one entry in ``BACKENDS`` (tests/unit/test_backend_caps.py).
Here, in the inputs layer, so that planning reads it without importing a backend.

Backend options are declared with the same ``opt(...)`` metadata as JobSpec's own options,
so the command line lists them in the backend's --help panel, the options reference documents them and
DistributedRunner takes them as keywords; their flags and job-file keys are the user's as before.

A JobSpec holds the one options object of the backend whose options were given (``backend_options``;
None: every backend's defaults). A flag of one backend given with another backend is an error naming
both: at once for --backend NAME, once --backend auto has chosen for it (the planner). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, TypeVar

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.options import Option, opt, option_fields


@dataclass(frozen=True)
class BackendOptions:
    """The options of one backend; each subclass is its backend's (REGISTRY)."""

    panel: ClassVar[str] = ""  # the --help panel its flags are listed in

    def validate(self) -> None:
        """Raise UserError, naming the flag, for a value the backend cannot take."""


@dataclass(frozen=True)
class DeepSpeedOptions(BackendOptions):
    panel: ClassVar[str] = "DeepSpeed"

    launcher: str = field(
        default="pdsh",
        metadata=opt(
            "--launcher", help="With --backend deepspeed: its multi-node runner, pdsh or openmpi.", panel="DeepSpeed"
        ),
    )
    launcher_args: Optional[str] = field(
        default=None,
        metadata=opt(
            "--launcher-args",
            "--launcher_args",
            help="With --backend deepspeed: extra arguments for its runner (one string).",
            panel="DeepSpeed",
        ),
    )

    def validate(self) -> None:
        if self.launcher not in ("pdsh", "openmpi"):
            raise UserError(f"unknown DeepSpeed launcher {self.launcher!r}", where="--launcher", hint="pdsh or openmpi")


@dataclass(frozen=True)
class SlurmOptions(BackendOptions):
    """srun's allocation options from a login node, the user's own srun options, and --sbatch."""

    panel: ClassVar[str] = "Slurm"

    partition: Optional[str] = field(
        default=None,
        metadata=opt("--partition", help="With --backend slurm from a login node: srun's partition.", panel="Slurm"),
    )
    time: Optional[str] = field(
        default=None,
        metadata=opt(
            "--time", help="With --backend slurm from a login node: srun's time limit (e.g. 1:00:00).", panel="Slurm"
        ),
    )
    account: Optional[str] = field(
        default=None,
        metadata=opt("--account", help="With --backend slurm from a login node: srun's account.", panel="Slurm"),
    )
    sbatch: Optional[str] = field(
        default=None,
        metadata=opt(
            "--sbatch",
            help="With --backend slurm: write a batch script (and a private env file beside it) for this "
            "job instead of running it; submit it with sbatch.",
            panel="Slurm",
        ),
    )
    slurm_args: Optional[str] = field(
        default=None,
        metadata=opt(
            "--slurm-args",
            "--slurm_args",
            help="With --backend slurm: more srun options, one string (split like a shell would, never run by one).",
            panel="Slurm",
        ),
    )


AUTO = "auto"  # --backend auto: not a backend, a choice made while planning (AUTO_* below)
DEFAULT_START_TIMEOUT = 900.0  # seconds for every rank to start, unless --start-timeout says otherwise


def _never(options: Optional[BackendOptions]) -> bool:
    return False


def _always(options: Optional[BackendOptions]) -> bool:
    return True


@dataclass(frozen=True)
class Capabilities:
    """What one backend can do: the only thing the core asks of a backend's name."""

    module: str  # the module of its Backend (backends/__init__.py: detect, commands, run)
    multi_host: bool  # may run ranks on other hosts than this one
    one_command: bool  # one command starts every node: each node's device subset travels in job variables
    ssh_preflight: bool  # reaches its hosts over ssh: ssh options, and the pre-flight unless --no-ssh-check
    rewrites_visibility: bool = False  # its per-node launcher sets CUDA_VISIBLE_DEVICES to slot numbers
    scheduler: bool = False  # a scheduler places the ranks on its allocation (no hostfile, no ssh, nodes
    # probed through it); the launcher owns no rank process on its own host
    batch_script: bool = False  # writes a batch script for the job instead of running it (--sbatch)
    start_timeout: Optional[float] = DEFAULT_START_TIMEOUT  # --start-timeout's default (None: no bound of ours)
    options: Optional[type[BackendOptions]] = None  # the options it takes (BackendOptions above)
    openmpi: Callable[[Optional[BackendOptions]], bool] = _never  # OpenMPI starts its ranks (with these
    # options): one OpenMPI major version on every host, checked by the pre-flight
    daemon_tree: bool = False  # its own mpirun can carry the pre-flight, the daemons and the sweep through
    # OpenMPI's daemon tree (--fan-out tree, plan/fanoutmode.py)


def _deepspeed_openmpi(options: Optional[BackendOptions]) -> bool:
    return options_of(options, DeepSpeedOptions).launcher == "openmpi"


# backend name -> what it can do, in the order --help lists them.
BACKENDS: dict[str, Capabilities] = {
    "local": Capabilities("gaudi_launch.backends.local", multi_host=False, one_command=False, ssh_preflight=False),
    "mpirun": Capabilities(
        "gaudi_launch.backends.mpirun",
        multi_host=True,
        one_command=True,
        ssh_preflight=True,
        openmpi=_always,
        daemon_tree=True,
    ),
    "deepspeed": Capabilities(
        "gaudi_launch.backends.deepspeed",
        multi_host=True,
        one_command=True,
        ssh_preflight=True,
        rewrites_visibility=True,  # DeepSpeed's launch.py, even for whole hosts
        options=DeepSpeedOptions,
        openmpi=_deepspeed_openmpi,
    ),
    "slurm": Capabilities(
        "gaudi_launch.backends.slurm",
        multi_host=True,
        one_command=True,
        ssh_preflight=False,
        scheduler=True,
        batch_script=True,
        start_timeout=None,  # srun may wait in the queue for its allocation
        options=SlurmOptions,
    ),
}
# --backend auto's choice: this host alone; several hosts (or another one); inside an allocation, no hostfile.
AUTO_ONE_HOST, AUTO_HOSTS, AUTO_IN_ALLOCATION = "local", "mpirun", "slurm"


def capabilities(backend: str) -> Capabilities:
    """The capabilities of a backend by name (not auto: it has chosen one by the time anything asks); an
    unknown name is the user's --backend, wherever it is asked first."""
    try:
        return BACKENDS[backend]
    except KeyError:
        raise UserError(
            f"unknown backend {backend!r}", where="--backend", hint="one of: " + ", ".join(choices())
        ) from None


def choices() -> tuple[str, ...]:
    """What --backend takes: auto, then every registered backend."""
    return (AUTO, *BACKENDS)


def register(name: str, caps: Capabilities) -> Callable[[], None]:
    """Add a backend (and its options); returns what takes it out again (a test's backend)."""
    if name in BACKENDS or name == AUTO:
        raise ValueError(f"backend {name!r} exists already")
    BACKENDS[name] = caps
    if caps.options is not None:
        REGISTRY[name] = caps.options
        OWNER.update({f.name: name for f, _ in option_fields(caps.options)})

    def undo() -> None:
        del BACKENDS[name]
        if REGISTRY.pop(name, None) is not None:
            for key in [k for k, v in OWNER.items() if v == name]:
                del OWNER[key]

    return undo


# backend name -> the class of its options (those that declare some).
REGISTRY: dict[str, type[BackendOptions]] = {n: c.options for n, c in BACKENDS.items() if c.options is not None}

T = TypeVar("T", bound=BackendOptions)


def backend_option_fields() -> list[tuple[str, dataclasses.Field, Option]]:
    """(backend, field, Option) of every backend's options, in REGISTRY order then declaration order."""
    return [(name, f, option) for name, cls in REGISTRY.items() for f, option in option_fields(cls)]


# option name -> its backend (names are unique across JobSpec and every backend: test_backend_options checks)
OWNER = {f.name: backend for backend, f, _ in backend_option_fields()}


def flag(name: str) -> str:
    """The flag that names a backend option in messages: its first spelling."""
    cls = REGISTRY[OWNER[name]]
    return next(o.flags[0] for f, o in option_fields(cls) if f.name == name)


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The backend options among ``values`` that say something: not None and not their default."""
    defaults = {f.name: f.default for _, f, _ in backend_option_fields()}
    return {k: v for k, v in values.items() if k in OWNER and v is not None and v != defaults[k]}


def options_from(backend: str, values: Mapping[str, Any]) -> Optional[BackendOptions]:
    """The options object of the backend whose options ``values`` give (see ``given``), None when none
    is. Options of two backends, or of another backend than --backend NAME, raise a UserError naming both."""
    chosen = given(values)
    owners = sorted({OWNER[k] for k in chosen}, key=list(REGISTRY).index)
    if len(owners) > 1:
        a, b = (next(k for k in chosen if OWNER[k] == o) for o in owners[:2])
        raise UserError(
            f"{flag(a)} is an option of --backend {owners[0]} and {flag(b)} one of --backend {owners[1]}",
            where=flag(b),
            hint="a job runs with one backend: keep the options of that one",
        )
    if not owners:
        return None
    options = REGISTRY[owners[0]](**chosen)
    if backend != AUTO:
        check_backend(options, backend)
    return options


def check_backend(options: Optional[BackendOptions], backend: str, auto: bool = False) -> None:
    """A backend's options given for a job of another backend: a UserError naming both. ``auto``: --backend
    auto chose ``backend``."""
    if options is None or REGISTRY.get(backend) is type(options):
        return
    said = list(given(dataclasses.asdict(options)))
    if not said:
        return  # its defaults only: nothing the other backend would ignore
    owner, name = OWNER[said[0]], said[0]
    chose = f"--backend auto chose {backend} for this job" if auto else f"not of --backend {backend}"
    raise UserError(
        f"{flag(name)} is an option of --backend {owner}, {chose}",
        where=flag(name),
        hint=f"use --backend {owner}, or leave {flag(name)} out",
    )


def options_of(options: Optional[BackendOptions], cls: type[T]) -> T:
    """The options of backend class ``cls``: the object given, else its defaults."""
    return options if isinstance(options, cls) else cls()
