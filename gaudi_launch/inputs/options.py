"""The job options, declared once: each JobSpec field that is an option carries its flags and help.

The CLI builds its options from these (cli.py, grouped in --help by ``panel``) and DistributedRunner takes each as a keyword
(runner.py); tests/unit/inputs/test_options.py checks that the three agree. Pure: no click here, so the
Python entry point does not pay for the command line's parser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

KEY = "gaudi_launch.option"
# The --help panels, in the order they are shown; every option names one.
PANELS = ("Hosts", "Devices", "Script", "Environment", "SSH", "Long runs", "Slurm", "DeepSpeed", "Output and modes")


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...] = ()  # command-line spellings; empty when `via` sets the field instead
    help: str = ""
    via: str = ""  # a command-line-only flag (inputs/commandline.py) that sets this field
    panel: str = ""  # the --help panel it is listed in (PANELS)


def opt(*flags: str, help: str, panel: str = "") -> dict[str, Option]:
    """Field metadata of an option: ``field(default=..., metadata=opt("--x", "--x_y", help="...", panel="SSH"))``."""
    return {KEY: Option(flags=flags, help=help, panel=panel)}


def via(flag: str) -> dict[str, Option]:
    """Field metadata of an option the command line sets through its own flag (e.g. --no-ssh-check)."""
    return {KEY: Option(via=flag)}


def option_fields(cls) -> list[tuple[dataclasses.Field, Option]]:
    """(field, Option) of every option of the dataclass, in declaration order."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]


def default_of(f: dataclasses.Field) -> Any:
    """A field's default as a keyword default: None where it is made per instance (lists, dicts,
    this interpreter), which the spec builders read as "the usual"."""
    return None if f.default is dataclasses.MISSING else f.default
