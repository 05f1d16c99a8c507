"""The launch command is built from the options its command line names (cli._named_in: Typer 0.29 builds a
pydantic adapter for every option of a command, given or not), and must read every command line exactly as
the command of all options does: the same values, the same errors."""

from __future__ import annotations

import contextlib
import io
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaudi_launch import cli
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
    return draw(st.sampled_from([[], ["check"]])) + argv + ["train.py", *tail]


def _read(argv: list[str], monkeypatch, whole: bool):
    seen = []
    stub = types.SimpleNamespace(run_command=lambda values: seen.append(values) or 0)
    monkeypatch.setattr(cli, "_root", lambda: stub)
    if whole:
        monkeypatch.setattr(cli, "_named_in", lambda argv: None)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(list(argv))
    monkeypatch.undo()
    return rc, seen, err.getvalue()


@SETTINGS
@given(command_lines())
def test_a_command_of_the_given_options_reads_every_command_line_as_the_whole_one(monkeypatch, argv):
    assert _read(argv, monkeypatch, whole=False) == _read(argv, monkeypatch, whole=True)


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
    named = cli._named_in(["--num_devices=2", "--dry-run", "train.py", "--bf16"])
    assert named == {"num_devices", "dry_run"} | ({"bf16"} if any(o.name == "bf16" for o in OPTIONS) else set())
    assert cli._named_in(["train.py", "-h"]) is None
    assert cli._named_in(["--help"]) is None


def test_a_short_option_with_its_value_attached_is_named(monkeypatch):
    assert "env" in cli._named_in(["-xA=B", "train.py"])
    assert _read(["-xA=B", "train.py"], monkeypatch, whole=False) == _read(
        ["-xA=B", "train.py"], monkeypatch, whole=True
    )
