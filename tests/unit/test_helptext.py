"""The launch and check commands' help, drawn without Typer (helptext.py), against the Typer command's own: the
same flags in the same panels, every line within the terminal's width, and a plain launch line or its help
never importing Typer, click, pydantic or rich (issue 37 item 7: the start-up budgets)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from gaudi_launch import cli, commands, plainline, typercli
from gaudi_launch.inputs.commandline import launch_options
from tests.unit.test_options_doc import flags_of_help

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _typer_help(argv: list[str], monkeypatch) -> str:
    monkeypatch.setattr(plainline, "read", lambda argv, checked: None)
    monkeypatch.setenv("COLUMNS", "250")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    monkeypatch.undo()
    return out.getvalue()


def _panels(text: str) -> list[str]:
    return re.findall(r"╭─ (.+?) ─", text)


@pytest.mark.parametrize("command", ["launch", "check"])
def test_our_help_lists_the_flags_and_panels_of_the_typer_commands_help(command, monkeypatch):
    argv = ["--help"] if command == "launch" else ["check", "--help"]
    theirs = _typer_help(argv, monkeypatch)
    ours = commands.help_page(command, 250)
    assert flags_of_help(ours) == flags_of_help(theirs) and len(flags_of_help(ours)) > (
        50 if command == "launch" else 20
    )
    assert _panels(ours) == _panels(theirs)
    assert "Usage: gaudi-launch " + ("check " if command == "check" else "") + "[OPTIONS] [SCRIPT]" in ours


@pytest.mark.parametrize("width", [60, 80, 123, 250])
def test_every_line_fits_the_width_and_no_help_text_is_lost(width):
    page = commands.help_page("launch", width)
    assert all(len(line) <= width for line in page.splitlines())
    words = set(page.replace("│", " ").split())
    for o in launch_options():
        assert set(o.option.help.split()) <= words, o.name
    assert "env [--json]" in page  # HELP's rich escapes undone


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["-h"], ["--num_devices", "2", "--help", "train.py", "--lr", "1"], ["check", "-h"]],
)
def test_help_among_the_options_shows_the_page(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out == commands.help_page("check" if argv[0] == "check" else "launch", 100)


def test_help_as_the_scripts_word_is_the_scripts(capsys):
    assert plainline.read(["train.py", "--help"], commands.checked()) == (
        "launch",
        {"script": "train.py", "script_args": ["--help"]},
    )


def test_a_misspelt_option_beside_help_is_still_an_error(capsys):
    assert cli.main(["--help", "--num-devicez", "2"]) == 2
    assert "No such option: --num-devicez" in capsys.readouterr().err


def imported_by(argv: list[str], cwd) -> set[str]:
    """The modules ``python -m gaudi_launch ARGV`` imports (-X importtime), after it exits 0."""
    (cwd / "x.py").write_text("")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gaudi_launch", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [["--help"], ["--dry-run", "--num_devices", "2", "x.py"]])
def test_a_plain_line_imports_no_typer_click_pydantic_or_rich(tmp_path, argv):
    modules = imported_by(argv, tmp_path)
    assert "gaudi_launch.cli" in modules and "gaudi_launch.plainline" in modules
    assert {m.split(".")[0] for m in modules} & {"typer", "click", "pydantic", "rich", "yaml"} == set()


def test_a_one_host_dry_run_imports_nothing_only_a_started_job_needs(tmp_path):
    """The supervisor, the ssh pre-flight, the one-pass gate, the collective test and OpenSSL (secrets, hmac)
    load when a job starts, not for its plan (the dry run's 0.3 s budget); the plan itself is made."""
    modules = imported_by(["--dry-run", "--num_devices", "2", "x.py"], tmp_path)
    assert {"gaudi_launch.plan.planner", "gaudi_launch.remote.hostprobe", "gaudi_launch.backends.job"} <= modules
    started = {
        "gaudi_launch.process.supervise",
        "gaudi_launch.remote.hostchecks",
        "gaudi_launch.remote.onepass",
        "gaudi_launch.collective",
        "gaudi_launch.pairrounds",
        "gaudi_launch.reports.environment",
        "secrets",
        "hmac",
        "zipfile",
    }
    assert modules & started == set()


def test_other_lines_still_go_to_typer():
    assert "typercli" in typercli.__name__  # imported here, by this test module, only
    assert plainline.read(["--version"], commands.checked()) is None
    assert plainline.read(["env", "--help"], commands.checked()) is None
