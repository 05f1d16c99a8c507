"""Options that belong to one backend, declared by it (as torchx's runopts): DeepSpeed's runner, srun's
allocation and the batch script. Declared with the same ``opt(...)`` metadata as JobSpec's own options,
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
from typing import Any, ClassVar, Optional, TypeVar

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


# backend name -> the class of its options; local and mpirun declare none.
REGISTRY: dict[str, type[BackendOptions]] = {"deepspeed": DeepSpeedOptions, "slurm": SlurmOptions}

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
    if backend != "auto":
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
