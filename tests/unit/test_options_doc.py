"""docs/options.md is what scripts/gen_options_doc.py writes now, and lists exactly the flags that
`gaudi-launch --help` lists (read loosely, so that click's help and Typer's rich panels both parse)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAG = re.compile(r"^--?[A-Za-z][\w-]*$")
METAVAR = re.compile(r"^([A-Z][A-Z_|]*(\.\.\.)?|<[^>]*>|\[[^\]]*\])$")


def generator():
    spec = importlib.util.spec_from_file_location("gen_options_doc", ROOT / "scripts" / "gen_options_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flags_of_help(text: str) -> set[str]:
    """The flags an option list names, in click's format ('  -i, --include TEXT  help') or rich's
    ('│ --include  -i  <str>  help │'): the leading flag and metavar words of an option's first line.
    Description and help text never count (they may name flags too). Pure."""
    rich = "╭" in text
    flags: set[str] = set()
    in_options = rich
    for line in text.splitlines():
        if not rich:
            if re.match(r"^(\S[^:]*)?Options[^:]*:\s*$", line):  # "Options:", "Options (as for a launch):"
                in_options = True
                continue
        elif not line.startswith("│"):
            continue
        body = line.strip("│").rstrip() if rich else line
        indent = len(body) - len(body.lstrip())
        if not in_options or indent > 3 or not body.lstrip().startswith("-"):
            continue
        # columns: click has names+metavar, help; rich has names, short names, metavar, help
        for column in re.split(r"\s{2,}", body.strip()):
            words = column.split()
            names = [p for w in words for p in re.split(r"[,/]", w) if p]
            if all(FLAG.match(n) for n in names):
                flags.update(names)
            elif all(FLAG.match(n) for n in names[:-1]) and METAVAR.match(words[-1]):
                flags.update(names[:-1])  # '--hostfile, --hostfile_path TEXT'; '<str>' alone
            else:
                break  # the help text starts
    return flags


def flags_of_doc(text: str) -> set[str]:
    """The flags in the first column of docs/options.md's tables. Pure."""
    return {
        flag
        for line in text.splitlines()
        if line.startswith("| `-")
        for flag in re.findall(r"`(-[^`]+)`", line.split(" | ", 1)[0])
    }


def test_the_options_reference_is_what_the_generator_writes_now():
    current = (ROOT / "docs" / "options.md").read_text()
    assert current == generator().render(), "docs/options.md is stale: run .venv/bin/python scripts/gen_options_doc.py"


def test_a_default_of_zero_is_shown():
    rows = {r[2]: r[3] for r in generator().rows()}
    assert rows["`max_restarts`"] == "`0`" and rows["`spare_hosts`"] == "`0`"
    assert rows["`no_python`"] == ""  # False: a flag that is off says nothing


def test_the_options_reference_lists_the_flags_of_help():
    env = dict(os.environ, COLUMNS="250", TERMINAL_WIDTH="250", NO_COLOR="1")
    out = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--help"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    in_help = flags_of_help(out.stdout)
    in_doc = flags_of_doc((ROOT / "docs" / "options.md").read_text())
    assert len(in_help) > 50, out.stdout  # the parser read the option list
    assert in_help - in_doc == set(), "in --help but not in docs/options.md: declare it, then regenerate"
    assert in_doc - in_help == set(), "in docs/options.md but not in --help"


def test_the_loose_reader_reads_click_and_rich_help():
    click_help = (
        "Usage: x [OPTIONS]\n\n  Examples:\n    gaudi-launch check --hostfile H train.py (also\n    --check-only)\n\n"
        "Options:\n  --hostfile, --hostfile_path TEXT\n                                  Hostfile; see\n"
        "                                  --include.\n  -i, --include TEXT  Use only these.\n"
        "  --efa / --no-efa                Set EFA.\n  --install-completion [SHELL]    Install.\n"
        "  -h, --help                      Show this message and exit.\n"
    )
    assert flags_of_help(click_help) == {
        "--hostfile", "--hostfile_path", "-i", "--include", "--efa", "--no-efa", "--install-completion", "-h", "--help"
    }  # fmt: skip
    rich_help = (
        " Usage: x [OPTIONS] [script]\n\n gaudi-launch check --hostfile H (also\n --check-only)\n\n"
        "╭─ Hosts ─────────╮\n│ --hostfile,--hostfile_path   <str>  Hostfile; see       │\n"
        "│                                     --include.          │\n│ --include  -i  TEXT  Use these.  │\n"
        "│ --efa    --no-efa    <bool>  EFA. --dry-run here   │\n╰─────────╯\n"
    )
    assert flags_of_help(rich_help) == {"--hostfile", "--hostfile_path", "--include", "-i", "--efa", "--no-efa"}


def test_doc_flags_are_read_from_the_first_column_only():
    doc = "| flags | keyword |\n|---|---|\n| `--efa`, `--no-efa` | `efa` | | Set `--x`. |\n| text `--y` |\n"
    assert flags_of_doc(doc) == {"--efa", "--no-efa"}
