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
    """Field metadata of an option: ``field(default=..., metadata=opt("--x-y", help="...", panel="SSH"))``; the
    other spelling of each long flag (``--x_y``) is added here, so every option takes both."""
    return {KEY: Option(flags=both_spellings(flags), help=help, panel=panel)}


def _other_spelling(flag: str) -> str:
    """``--a-b`` for ``--a_b`` and back; '' for a short flag or a name of one word. Pure."""
    name = flag[2:]
    if not flag.startswith("--") or not ("-" in name or "_" in name):
        return ""
    return "--" + (name.replace("-", "_") if "-" in name else name.replace("_", "-"))


def both_spellings(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The flags with each long one's other spelling where it is missing; for an on/off pair
    (``--efa/--no-efa``) the missing off spelling as click's off-only declaration (`` /--no_efa``). Pure."""
    given = {part for flag in flags for part in flag.split("/")}
    extra = []
    for flag in flags:
        on, _, off = flag.partition("/")
        alt_on, alt_off = (_other_spelling(f) for f in (on, off))
        alt_on = alt_on if alt_on and alt_on not in given else ""
        alt_off = alt_off if alt_off and alt_off not in given else ""
        if off and (alt_on or alt_off):
            extra.append(f"{alt_on or ' '}/{alt_off or ' '}" if alt_off else f"{alt_on}/{off}")
        elif not off and alt_on:
            extra.append(alt_on)
        given |= {alt_on, alt_off}
    return (*flags, *extra)


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
