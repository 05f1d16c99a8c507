"""The plain launch line read without Typer: ``[launch|check] [OPTIONS] SCRIPT [SCRIPT_ARGS]...``. Pure.

Typer's command costs about 0.1 s before it reads a word (typer, click and pydantic imported, a parameter
built per option): most of the start-up budget of a launch whose line is plain. This reader takes the
same option fields (inputs/commandline.launch_options) and reads a line as click's parser does, for the
shapes it knows: ``--flag``, ``--flag VALUE``, ``--flag=VALUE``, ``-s VALUE``, ``-sVALUE``, a list option
repeated, the last of a single one winning, SCRIPT the first word that is no option and every word after
it the script's; ``-h``/``--help`` among the options asks for the command's help (helptext.py draws it). Anything
else (--version, an unknown or misspelt option, a value missing, ``--``, other commands) is None: the Typer
command reads it, with its messages and suggestions.
tests/unit/test_cli_given_options.py holds the two readings equal over generated lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from gaudi_launch.inputs.commandline import LaunchOption, kind_of, launch_options

# The commands this reader takes; the first word naming any other command goes to Typer.
PLAIN = ("launch", "check")
OTHERS = ("run", "env", "report", "completion")
HELP_FLAGS = ("-h", "--help")
HELP = "help"  # the key of a line that asks for help: its value is True, no other matters


def _table(options: Iterable[LaunchOption]) -> dict[str, tuple[str, Any]]:
    """{spelling: (field name, the value a flag sets, or None for an option taking a value)}."""
    table: dict[str, tuple[str, Any]] = {}
    for o in options:
        kind, _ = kind_of(o.hint)
        for flag in o.option.flags:
            on, _, off = (s.strip() for s in flag.partition("/"))
            if on:
                table[on] = (o.name, True if kind is bool else None)
            if off:
                table[off] = (o.name, False)
    return table


def read(argv: list[str], checked: Optional[set[str]] = None) -> Optional[tuple[str, dict[str, Any]]]:
    """(command, the values given) for a plain line, as the Typer command would pass them on (options not given
    left out; ``script_args`` only when there are any), or (command, {HELP: True}) where help is asked for (as
    click, only once every word before SCRIPT reads); None for a line Typer must read. ``checked``: the options
    ``check`` takes (all when None)."""
    command, words = ("launch", argv)
    if argv[:1] and argv[0] in PLAIN:
        command, words = argv[0], argv[1:]
    elif argv[:1] and argv[0] in OTHERS:
        return None
    options = launch_options()
    many = {o.name for o in options if kind_of(o.hint)[1]}
    if command == "check" and checked is not None:
        options = [o for o in options if o.name in checked]
    table = _table(options)
    values: dict[str, Any] = {}
    wants_help = False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or word == "-":
            return None
        if not word.startswith("-"):
            if wants_help:
                return command, {HELP: True}
            values["script"] = word
            if words[i + 1 :]:
                values["script_args"] = words[i + 1 :]
            return command, values
        if word in HELP_FLAGS:
            wants_help, i = True, i + 1
            continue
        if word.startswith("--"):
            flag, eq, attached = word.partition("=")
            value = attached if eq else None
        else:  # -s VALUE or -sVALUE (the rest of the word is the value: click's -xA=B)
            flag, value = word[:2], (word[2:] or None)
        if flag not in table:
            return None
        name, set_to = table[flag]
        if set_to is not None:  # a flag: takes no value, attached or combined (-mi) is Typer's to refuse
            if value is not None:
                return None
            values[name] = set_to
            i += 1
            continue
        if value is None:
            if i + 1 >= len(words):
                return None  # a value missing: Typer says which
            value, i = words[i + 1], i + 1
        values[name] = [*values.get(name, []), value] if name in many else value
        i += 1
    return (command, {HELP: True}) if wants_help else None  # no SCRIPT: Typer's message
