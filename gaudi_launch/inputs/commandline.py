"""The launch command's own options, and every option value checked against its field's type. Pure.

Besides JobSpec's options (spec.py), the command line takes other launchers' spellings (torchrun,
gaudi_spawn.py, DeepSpeed) and says how this command runs (dry run, JSON, job file). They are declared
here as JobSpec's are, on a dataclass's fields, so that the CLI, the job file and the options reference
read one list (``launch_options``). A value typed on the command line (text) and one read from the job
file (YAML) go through the same ``convert``: one set of rules and messages for both.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs import habits
from gaudi_launch.inputs.backend_options import REGISTRY, backend_option_fields
from gaudi_launch.inputs.envfile import parse_assignments
from gaudi_launch.inputs.options import PANELS, Option, opt, option_fields
from gaudi_launch.inputs.readfile import MAX_INPUT_BYTES, check_input
from gaudi_launch.inputs.spec import JobSpec, resolve_compat
from gaudi_launch.wire import DEVICE


@dataclass
class CommandLine:
    """Options of the command line alone: no JobSpec field of their own."""

    world_size: Optional[int] = field(
        default=None,
        metadata=opt("--world_size", "--world-size", help="gaudi_spawn.py's name for --num_devices.", panel="Devices"),
    )
    nproc_per_node: Optional[str] = field(
        default=None,
        metadata=opt(
            "--nproc-per-node",
            "--nproc_per_node",
            help="torchrun's name for --num_devices; also auto or gpu (the devices found) and cpu (this machine's "
            "CPUs).",
            panel="Devices",
        ),
    )
    device: Optional[str] = field(
        default=None,
        metadata=opt(
            "--device",
            help="hpu, cuda or cpu for the ranks' training runtime (default: what the host has).",
            panel="Devices",
        ),
    )
    nnodes: Optional[str] = field(
        default=None, metadata=opt("--nnodes", help="torchrun's name for --num_nodes.", panel="Hosts")
    )
    standalone: bool = field(
        default=False,
        metadata=opt(
            "--standalone", help="torchrun's: accepted (one host needs no rendezvous service).", panel="Hosts"
        ),
    )
    use_mpi: bool = field(
        default=False,
        metadata=opt("--use_mpi", "--use-mpi", help="gaudi_spawn.py: same as --backend mpirun.", panel="Hosts"),
    )
    use_deepspeed: bool = field(
        default=False,
        metadata=opt(
            "--use_deepspeed", "--use-deepspeed", help="gaudi_spawn.py: same as --backend deepspeed.", panel="DeepSpeed"
        ),
    )
    no_local_rank: bool = field(
        default=False,
        metadata=opt(
            "--no_local_rank",
            "--no-local-rank",
            help="Accepted for DeepSpeed compatibility: this is already the default.",
            panel="Script",
        ),
    )
    no_ssh_check: bool = field(
        default=False,
        metadata=opt("--no-ssh-check", "--no_ssh_check", help="Skip the SSH pre-flight of every host.", panel="SSH"),
    )
    check_only: bool = field(
        default=False,
        metadata=opt(
            "--check-only",
            "--check_only",
            help="Run the pre-flight only and print its table (exit 3 when a check fails). Same as: gaudi-launch "
            "check.",
            panel="SSH",
        ),
    )
    ranks_filter: Optional[str] = field(
        default=None,
        metadata=opt(
            "--local-ranks-filter",
            "--local_ranks_filter",
            "--ranks",
            help="Show only these ranks on the console, e.g. 0 or 0,3 (every rank still goes to --log-dir and to "
            "the failure summary).",
            panel="Output and modes",
        ),
    )
    dry_run: bool = field(
        default=False,
        metadata=opt("--dry-run", "--dry_run", help="Print the plan; start nothing.", panel="Output and modes"),
    )
    json_out: bool = field(
        default=False,
        metadata=opt("--json", help="With --dry-run: print the plan as one JSON object.", panel="Output and modes"),
    )
    config: Optional[str] = field(
        default=None,
        metadata=opt(
            "--config",
            help="YAML job file holding any of these options; the command line wins.",
            panel="Output and modes",
        ),
    )
    from_plan: Optional[str] = field(
        default=None,
        metadata=opt(
            "--from-plan",
            "--from_plan",
            help="Run the plan a dry run wrote (--dry-run --json > plan.json), in its directory, with all its "
            "options; nothing starts if the job planned now differs from it. Same as: gaudi-launch run plan.json.",
            panel="Output and modes",
        ),
    )


# Flags the command line adds itself (no value reaches the job): for the options reference.
EXTRA_OPTIONS = [
    Option(("--version", "-V"), "Print the version and exit.", panel="Options"),
    Option(("--install-completion",), "Install completion for the current shell.", panel="Options"),
    Option(("--show-completion",), "Show completion for the current shell.", panel="Options"),
    Option(("--help", "-h"), "Show this message and exit.", panel="Options"),
]
# Names that are no key of a job file (the job file itself).
NOT_IN_CONFIG = ("config",)


@dataclass(frozen=True)
class LaunchOption:
    """One option of the launch command: its field (the value's name and default), declaration and type."""

    field: dataclasses.Field
    option: Option
    hint: Any  # the field's type, e.g. Optional[int]

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def label(self) -> str:
        """The flag that names it in messages: its first long spelling."""
        return next((f.split("/")[0] for f in self.option.flags if f.startswith("--")), self.option.flags[0])

    @property
    def default(self) -> Any:
        return None if self.field.default is dataclasses.MISSING else self.field.default


def _of(cls) -> list[LaunchOption]:
    hints = typing.get_type_hints(cls)
    return [LaunchOption(f, o, hints[f.name]) for f, o in option_fields(cls) if o.flags]


def launch_options() -> list[LaunchOption]:
    """Every option of the launch command with a flag, in --help order (by panel, then declaration)."""
    found = _of(JobSpec) + [o for cls in REGISTRY.values() for o in _of(cls)] + _of(CommandLine)
    return sorted(found, key=lambda o: PANELS.index(o.option.panel))


COMMAND_LINE_OPTIONS = [o for _, o in option_fields(CommandLine)] + EXTRA_OPTIONS


def kind_of(hint) -> tuple[Any, bool]:
    """(the value's type without Optional, whether the option takes many values). Pure."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if typing.get_origin(hint) is typing.Union else hint
    origin = typing.get_origin(kind)
    return (origin or kind), origin in (list, dict)


def convert(hint, raw: Any, label: str) -> Any:
    """A value for a field of type ``hint``, from the command line's text or the job file's YAML value.
    Text becomes a number as the field's type says; YAML values must already be of that type (numbers
    pass as text where text is asked for). A UserError names ``label`` (the flag, its ``where``) and the value. Pure."""
    kind, many = kind_of(hint)
    if raw is None:
        raise UserError("has no value", where=label, hint=f"give {label} a value, or leave it out")
    if many:
        if isinstance(raw, dict) and kind is dict:  # a job file's env: {NAME: value}
            raw = [f"{k}={'' if v is None else v}" for k, v in raw.items()]
        if not isinstance(raw, (list, tuple)):
            raise UserError("is a list", where=label, hint=f"{label.lstrip('-')}: [a, b]")
        return [_text(item, label) for item in raw]
    if kind is bool:
        if not isinstance(raw, bool):
            raise UserError(f"is true or false, got {raw!r}", where=label)
        return raw
    if isinstance(raw, (list, dict)):
        raise UserError(f"takes a single value, not a {type(raw).__name__}", where=label)
    if kind is int:
        if isinstance(raw, str) and raw.strip().lstrip("+-").isdigit():
            if len(raw.strip().lstrip("+-")) > _MAX_DIGITS:  # int() refuses 4300 digits: exit 2, not a crash
                raise UserError(f"must be a whole number of at most {_MAX_DIGITS} digits", where=label)
            return int(raw)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        raise UserError(f"must be a whole number, got {_shown(raw)}", where=label)
    if kind is float:
        try:
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                return float(raw)
            return float(raw) if isinstance(raw, str) else _not_a_number(raw, label)
        except OverflowError:  # a job file's 10**400 (a float's limit is about 1.8e308)
            raise UserError(f"is too large a number: {_shown(raw)}", where=label) from None
        except ValueError:
            return _not_a_number(raw, label)
    return _text(raw, label)


_MAX_DIGITS = 100  # far past any count, port or number of seconds


def _shown(raw: Any) -> str:
    """``raw`` for a message, cut short (repr of an int of 4300 digits or more raises ValueError). Pure."""
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw).bit_length() > 3 * _MAX_DIGITS:
        return f"a number of about {int(abs(raw).bit_length() * 0.30103) + 1} digits"
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."


def _not_a_number(raw, label: str):
    raise UserError(f"must be a number, got {_shown(raw)}", where=label)


def _text(raw: Any, label: str) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return str(raw)  # script_args: [--lr, 3] -> "3"
    if isinstance(raw, (list, dict)):
        raise UserError("takes text, not a nested list or mapping", where=label)
    if raw is None:  # a job file's list item left empty (env: [null])
        raise UserError("has no value", where=label, hint=f"give {label} a value, or leave it out")
    raise UserError(f"takes text, got {raw!r}", where=label)


def spec_from_values(v: dict[str, Any], environ: Mapping[str, str]) -> JobSpec:
    """The JobSpec of the launch command's values (every option's, defaults filled in; ``script`` and
    ``script_args``): other launchers' spellings mapped onto ours. Pure but for ``--nproc-per-node cpu``
    (this machine's CPU count) and ``-x KEY`` (``environ``'s value)."""
    num_devices, num_nodes = v["num_devices"], v["num_nodes"]
    if v["nproc_per_node"] is not None:
        if num_devices is not None:
            raise UserError("--nproc-per-node and --num_devices say the same thing: give one", where="--nproc-per-node")
        num_devices = habits.nproc_per_node(v["nproc_per_node"])
    if v["nnodes"] is not None:
        if num_nodes is not None:
            raise UserError("--nnodes and --num_nodes say the same thing: give one", where="--nnodes")
        num_nodes = habits.nnodes(v["nnodes"])
    backend, num_devices = resolve_compat(
        backend=v["backend"],
        use_mpi=v["use_mpi"],
        use_deepspeed=v["use_deepspeed"],
        world_size=v["world_size"],
        num_devices=num_devices,
    )
    # Every JobSpec option from its own flag; the rest from the command-line-only spellings above.
    given = {f.name: v[f.name] for f, option in option_fields(JobSpec) if option.flags}
    given.update({f.name: v[f.name] for _, f, _ in backend_option_fields()})  # JobSpec.build sorts them out
    if not given["python"]:
        del given["python"]  # this interpreter
    given.update(
        program=[v["script"], *(v["script_args"] or [])] if v["script"] else [],
        num_nodes=num_nodes,
        num_devices=num_devices,
        backend=backend,
        env={**parse_assignments(v["env"] or [], "-x", environ=environ), **_device_env(v["device"])},
        export_prefixes=list(v["export_prefixes"] or []),
        ssh_check=not v["no_ssh_check"],
        console_ranks=_ranks(v["ranks_filter"]),
    )
    # files read later (ssh -F, the collective finding): a FIFO or /dev/zero is exit 2 now, not a hang
    for name, flag, what in (
        ("ssh_config", "--ssh-config", "ssh config file"),
        ("exclude_from", "--exclude-from", "file"),
    ):
        if given.get(name):
            check_input(os.path.expanduser(given[name]), MAX_INPUT_BYTES, where=flag, what=what)
    return JobSpec.build(**given)


def _ranks(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise UserError(f"--ranks {text!r}: rank numbers separated by commas, e.g. 0 or 0,3", where="--ranks")
    return sorted({int(p) for p in parts})


def _device_env(device: Optional[str]) -> dict:
    if device is None:
        return {}
    if device not in ("hpu", "cuda", "cpu"):
        raise UserError(f"unknown device {device!r}", where="--device", hint="hpu, cuda or cpu")
    return {DEVICE: device}
