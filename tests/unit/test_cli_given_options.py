"""Three readings of one command line must agree: the plain launch line read without Typer (plainline.py), the
Typer command built from the options the line names (typertypercli._named_in: Typer 0.29 builds a pydantic adapter
for every option of a command, given or not) and the Typer command of all options: the same values, the same
errors."""

from __future__ import annotations

import contextlib
import io
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaudi_launch import cli, commands, plainline, typercli
from gaudi_launch.inputs.commandline import kind_of, launch_options

OPTIONS = launch_options()
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _spellings(o) -> list[str]:
    return [s for f in o.option.flags for s in f.split("/")]


@st.composite
def command_lines(draw):
    argv = []
    for o in draw(st.lists(st.sampled_from(OPTIONS), max_size=6, unique_by=lambda o: o.name)):
        flag = draw(st.sampled_from(_spellings(o)))
        kind, many = kind_of(o.hint)
        if kind is bool:
            argv.append(flag)
            continue
        values = draw(
            st.lists(st.sampled_from(["1", "a=b", "x", "-3", "host:0,1"]), min_size=1, max_size=2 if many else 1)
        )
        for v in values:
            argv += [f"{flag}={v}"] if flag.startswith("--") and draw(st.booleans()) else [flag, v]
    # the script's own words may look like our options: they stay the script's
    tail = draw(st.lists(st.sampled_from(["--num_devices", "8", "--bf16", "-x", "--hostfile=h", "--"]), max_size=4))
    return draw(st.sampled_from([[], ["check"], ["launch"]])) + argv + ["train.py", *tail]


def _read(argv: list[str], monkeypatch, whole: bool, plain: bool = True):
    """(exit status, the values the launch got, stderr) of ``argv``: through cli.main (the plain reader first,
    unless not ``plain``), the Typer command of the named options, or of all of them (``whole``)."""
    seen = []
    stub = types.SimpleNamespace(run_command=lambda values: seen.append(values) or 0)
    monkeypatch.setattr(commands, "root", lambda: stub)
    if whole or not plain:
        monkeypatch.setattr(plainline, "read", lambda argv, checked: None)
    if whole:
        monkeypatch.setattr(typercli, "_named_in", lambda argv: None)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(list(argv))
    monkeypatch.undo()
    return rc, seen, err.getvalue()


@SETTINGS
@given(command_lines())
def test_every_reading_of_a_command_line_is_the_whole_commands(monkeypatch, argv):
    whole = _read(argv, monkeypatch, whole=True)
    assert _read(argv, monkeypatch, whole=False, plain=False) == whole  # Typer, the named options
    assert _read(argv, monkeypatch, whole=False) == whole  # the plain reader where it reads the line


@SETTINGS
@given(command_lines())
def test_the_plain_reader_gives_what_typer_gives_where_it_reads_a_line(monkeypatch, argv):
    plain = plainline.read(argv, commands.checked())
    if plain is not None:
        rc, seen, err = _read(argv, monkeypatch, whole=True)
        assert (rc, err) == (0, "")
        assert seen == [{**plain[1], **({"check_only": True} if plain[0] == "check" else {})}]


@pytest.mark.parametrize(
    "argv, command, values",
    [
        (
            ["--num_devices", "2", "--dry-run", "train.py", "--bf16"],
            "launch",
            {"num_devices": "2", "dry_run": True, "script": "train.py", "script_args": ["--bf16"]},
        ),
        (
            ["check", "--hostfile=h", "-i", "a:0,1@b", "--ssh-port", "22", "t.py"],
            "check",
            {"hostfile": "h", "include": "a:0,1@b", "ssh_port": "22", "script": "t.py"},
        ),
        (
            ["-xA=B", "-x", "C=D", "--env=E=F", "--no-efa", "--efa", "--no_efa", "-m", "pkg.mod", "--lr", "-3"],
            "launch",
            {
                "env": ["A=B", "C=D", "E=F"],
                "efa": False,
                "module": True,
                "script": "pkg.mod",
                "script_args": ["--lr", "-3"],
            },
        ),
        (["--master_port", "1", "--master_port", "2", "t.py"], "launch", {"master_port": "2", "script": "t.py"}),
    ],
)
def test_plain_launch_lines_are_read_without_typer(argv, command, values):
    assert plainline.read(argv, commands.checked()) == (command, values)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--version"],
        ["--num-devicez", "2", "t.py"],
        ["--dry-run=yes", "t.py"],
        ["-mi", "h", "t.py"],
        ["--hostfile"],
        ["--", "t.py"],
        ["env"],
        ["run", "plan.json"],
        ["check", "--dry-run", "t.py"],  # check takes no --dry-run: Typer says so
    ],
)
def test_lines_the_plain_reader_leaves_to_typer(argv):
    assert plainline.read(argv, commands.checked()) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-devicez", "2", "train.py"],  # a misspelling: the whole command's suggestions
        ["--hostfile"],  # a value missing
        ["check", "--nmu_devices", "2"],
    ],
)
def test_errors_are_the_whole_commands(monkeypatch, argv):
    rc, seen, err = _read(argv, monkeypatch, whole=False)
    assert (rc, seen, err) == _read(argv, monkeypatch, whole=True)
    assert rc == 2 and not seen and err.startswith("gaudi-launch: error:")


def test_only_the_named_options_are_built_and_help_builds_them_all():
    named = typercli._named_in(["--num_devices=2", "--dry-run", "train.py", "--bf16"])
    assert named == {"num_devices", "dry_run"} | ({"bf16"} if any(o.name == "bf16" for o in OPTIONS) else set())
    assert typercli._named_in(["train.py", "-h"]) is None
    assert typercli._named_in(["--help"]) is None


def test_a_short_option_with_its_value_attached_is_named(monkeypatch):
    assert "env" in typercli._named_in(["-xA=B", "train.py"])
    assert _read(["-xA=B", "train.py"], monkeypatch, whole=False) == _read(
        ["-xA=B", "train.py"], monkeypatch, whole=True
    )
