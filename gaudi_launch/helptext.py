"""``gaudi-launch --help`` (and ``check --help``) drawn without Typer or rich. Pure.

Typer draws the same panels through rich: 0.3 s of a 0.4 s --help here, most of it rich's import and line
splitting. This draws them from the same option fields (inputs/commandline.launch_options), in the same panels
and order, with the flags, the value's kind and the help text, wrapped to the terminal's width. The other
commands' help stays Typer's. tests/unit/test_helptext.py holds it to the Typer command's flags.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Optional

from gaudi_launch.inputs.commandline import LaunchOption, kind_of
from gaudi_launch.inputs.options import PANELS, Option

_METAVAR = {int: "INTEGER", float: "NUMBER", str: "TEXT"}
_MIN_HELP = 24  # the help column's least width: the flags column gives way first


def _unmarked(text: str) -> str:
    """HELP as shown: its rich escapes ('\\[') undone."""
    return text.replace("\\[", "[")


def metavar(o: LaunchOption) -> str:
    """The kind of value an option takes, as help shows it; '' for a flag (it takes none)."""
    kind, _ = kind_of(o.hint)
    return "" if kind is bool else _METAVAR.get(kind, "TEXT")


def shown_help(o: LaunchOption, helps: Optional[dict[str, str]] = None) -> str:
    """An option's help text (``helps``: a command's own words for it), its default added unless it says one."""
    shown = (helps or {}).get(o.name, o.option.help)
    if o.default is not None and kind_of(o.hint)[0] is not bool and "default" not in shown.lower():
        shown += f" [default: {o.default}]"
    return shown


def _longs(flags: Iterable[str]) -> str:
    return ",".join(f for f in flags if f.startswith("--"))


def _shorts(flags: Iterable[str]) -> str:
    return ",".join(f for f in flags if not f.startswith("--"))


def _rows(
    options: Iterable[LaunchOption], extras: Iterable[Option], helps: dict[str, str]
) -> dict[str, list[tuple[str, str, str, str]]]:
    """{panel: [(long flags, short flags, metavar, help)]} in PANELS order, Options (the command's own) first."""
    panels: dict[str, list[tuple[str, str, str, str]]] = {"Options": []}
    for extra in extras:
        panels["Options"].append((_longs(extra.flags), _shorts(extra.flags), "", extra.help))
    for o in sorted(options, key=lambda o: PANELS.index(o.option.panel)):
        spellings = [s.strip() for f in o.option.flags for s in f.split("/") if s.strip()]
        panels.setdefault(o.option.panel, []).append(
            (_longs(spellings), _shorts(spellings), metavar(o), shown_help(o, helps))
        )
    return panels


def _panel(title: str, rows: list[tuple[str, str, str, str]], width: int) -> list[str]:
    inner = width - 4  # "│ " and " │"
    short_w = max(len(r[1]) for r in rows)
    meta_w = max(len(r[2]) for r in rows)
    middle = (short_w + 2 if short_w else 0) + (meta_w + 2 if meta_w else 0)
    flags_w = max(min(max(len(r[0]) for r in rows), inner // 3, inner - middle - 2 - _MIN_HELP), 8)
    help_w = inner - flags_w - 2 - middle
    lines = [f"╭─ {title} " + "─" * max(width - len(title) - 5, 0) + "╮"]
    for longs, shorts, meta, shown in rows:
        flag_lines = textwrap.wrap(longs.replace(",", ", "), flags_w, break_on_hyphens=False) or [""]
        flag_lines = [f.replace(", ", ",") for f in flag_lines]
        help_lines = textwrap.wrap(shown, help_w, break_on_hyphens=False) or [""]
        for i in range(max(len(flag_lines), len(help_lines))):
            left = (flag_lines[i] if i < len(flag_lines) else "").ljust(flags_w + 2)
            if short_w:
                left += (shorts if i == 0 else "").ljust(short_w + 2)
            if meta_w:
                left += (meta if i == 0 else "").ljust(meta_w + 2)
            body = (left + (help_lines[i] if i < len(help_lines) else "")).ljust(inner)
            lines.append(f"│ {body} │")
    lines.append("╰" + "─" * (width - 2) + "╯")
    return lines


def render(
    usage: str,
    text: str,
    options: Iterable[LaunchOption],
    width: int,
    extras: Iterable[Option] = (),
    helps: Optional[dict[str, str]] = None,
) -> str:
    """The help page: usage line, ``text`` (HELP, lines as written), then one panel per group of options:
    ``extras`` (the command's own flags, --help among them) first; ``helps``: other words for some options."""
    width = max(width, 60)
    out = ["", f" Usage: {usage}", ""]
    for block in _unmarked(text).strip("\n").split("\n\n"):  # prose wrapped as paragraphs, examples line by line
        lines = block.splitlines()
        if not any(line.startswith(" ") for line in lines):
            lines = [" ".join(lines)]
        for line in lines:
            indent = " " * (1 + len(line) - len(line.lstrip()))
            more = indent + ("    " if line.startswith(" ") else "")  # an example's rest: under its words
            out += textwrap.wrap(
                line.strip(), width - 1, initial_indent=indent, subsequent_indent=more, break_on_hyphens=False
            )
        out.append("")
    for title, rows in _rows(options, extras, helps or {}).items():
        out += _panel(title, rows, width)
    return "\n".join(out) + "\n"
