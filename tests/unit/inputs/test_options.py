"""Options declared once (gaudi_launch/inputs/options.py): every JobSpec option is a command-line option and
a DistributedRunner keyword, with one default, and reaches the same JobSpec from both; the Typer command
line takes every spelling, shows every option in its --help panel, and checks values by the fields' types."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Optional

import pytest

from gaudi_launch import cli, launch
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import OWNER, REGISTRY, SlurmOptions
from gaudi_launch.inputs.commandline import COMMAND_LINE_OPTIONS, convert, kind_of, launch_options
from gaudi_launch.inputs.options import PANELS, default_of
from gaudi_launch.inputs.spec import JobSpec, job_option_fields
from gaudi_launch.runner import DistributedRunner

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py

FIELDS = job_option_fields()  # JobSpec's own and its backends'
UPSTREAM = {"master_port": 29500}  # optimum-habana's positional default, kept


def test_every_option_is_a_cli_option_and_a_runner_keyword_with_one_default():
    options = {o.name: o for o in launch_options()}
    cli_flags = {flag for o in options.values() for s in o.option.flags for flag in s.split("/")}
    keywords = inspect.signature(DistributedRunner).parameters
    assert len(FIELDS) >= 40
    for f, option in FIELDS:
        if option.flags:
            assert options[f.name].option is option and options[f.name].default == default_of(f), f.name
            assert option.panel in PANELS, f.name
        else:  # set through a command-line-only flag (--no-ssh-check, --ranks)
            assert option.via in cli_flags, f.name
        assert f.name in keywords, f.name
        assert keywords[f.name].default == UPSTREAM.get(f.name, default_of(f)), f.name
    not_options = {f.name for f in JobSpec.__dataclass_fields__.values()} - {f.name for f, _ in FIELDS}
    assert not_options == {"program", "lost_hosts", "backend_options"}


def test_the_command_line_takes_every_spelling_for_its_own_field(monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "run_command", lambda given: seen.append(given) or 0)
    for o in launch_options():
        kind, many = kind_of(o.hint)
        for spelling in o.option.flags:
            for i, flag in enumerate(spelling.split("/")):  # --efa/--no-efa: True, then False
                if not flag.strip():  # ' /--no_efa': click's declaration of an off spelling alone
                    continue
                assert cli.main([flag] if kind is bool else [flag, "7"]) == 0, flag
                expected = (i == 0) if kind is bool else ["7"] if many else "7"
                assert seen.pop() == {o.name: expected}, flag
    assert cli.main(["check", "--num_devices", "2", "t.py", "-x"]) == 0
    assert seen.pop() == {"num_devices": "2", "check_only": True, "script": "t.py", "script_args": ["-x"]}


def test_every_long_flag_is_taken_in_both_spellings():
    # --strict-host-keys and --no-efa had no underscore spelling while every other option had both.
    for o in launch_options():
        flags = {f.strip() for s in o.option.flags for f in s.split("/") if f.strip().startswith("--")}
        for flag in flags:
            name = flag[2:]
            if "-" in name or "_" in name:
                other = "--" + (name.replace("-", "_") if "-" in name else name.replace("_", "-"))
                assert other in flags, (o.name, flag)
    assert cli.main(["--strict_host_keys", "--no_efa", "--dry-run", "--num_devices", "1", "t.py"]) is not None


def test_ctrl_c_while_a_command_runs_is_said_and_exits_130(monkeypatch, capsys):
    def interrupted(given):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_command", interrupted)
    assert cli.main(["--dry-run", "t.py"]) == 130
    assert capsys.readouterr().err == "gaudi-launch: interrupted\n"


def test_help_shows_every_option_in_its_panel_in_order(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich cuts long spellings at the terminal's width
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage: gaudi-launch [OPTIONS] [SCRIPT] [SCRIPT_ARGS]" in out  # typer 0.29 adds "...", 0.28 not
    starts = [out.index(f"─ {panel} ─") for panel in PANELS]
    assert starts == sorted(starts)
    for o in launch_options() + [o for o in COMMAND_LINE_OPTIONS]:
        option = getattr(o, "option", o)
        panel = out.index(f"─ {option.panel} ─")
        end = out.find("╰", panel)
        assert all(flag in out[panel:end] for s in option.flags for flag in s.split("/")), option.flags


def test_values_are_checked_against_the_fields_types():
    assert convert(Optional[int], "8", "--num_devices") == 8
    assert convert(float, "2.5", "--grace") == 2.5 and convert(float, 3, "--grace") == 3.0
    assert convert(list[str], ["3", 4], "--export-prefix") == ["3", "4"]
    assert convert(dict[str, str], {"A": 1, "B": None}, "--env") == ["A=1", "B="]
    assert convert(Optional[str], 29, "--time") == "29"  # YAML's 29 as text
    for hint, raw, words in [
        (Optional[int], "abc", "must be a whole number, got 'abc'"),
        (Optional[int], 2.5, "must be a whole number"),
        (Optional[int], True, "must be a whole number"),
        (float, "soon", "must be a number, got 'soon'"),
        (float, False, "must be a number"),
        (bool, "yes", "is true or false, got 'yes'"),
        (Optional[str], {"a": 1}, "takes a single value, not a dict"),
        (list[str], "A", "is a list"),
        (list[str], [["A"]], "takes text, not a nested list or mapping"),
        (Optional[int], None, "has no value"),
    ]:
        with pytest.raises(UserError) as exc:
            convert(hint, raw, "--opt")
        assert exc.value.where == "--opt" and words in exc.value.message, (hint, raw)


def test_upstream_positional_parameters_keep_their_place():
    params = [p for p in inspect.signature(DistributedRunner).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in params] == [
        ("command_list", None),
        ("world_size", 1),
        ("hostfile", None),
        ("use_mpi", False),
        ("use_deepspeed", False),
        ("master_port", 29500),
        ("use_env", False),
        ("map_by", "socket"),
        ("multi_hls", None),
    ]


# Options the runner did not take before options were declared once, with values off their defaults.
VALUES = dict(
    num_devices=2,
    ssh_timeout=3.0,
    strict_host_keys=True,
    wait_hosts=5.0,
    export_prefixes=["NCCL_"],
    hccl_ofi_wrapper="/opt/w",
    launcher="openmpi",
    launcher_args="-x A",
    console_ranks=[0, 1],
    module=True,
    restart_on="hang",
    hostfile=None,
    include=None,
    grace=2.5,
    efa=False,
    ssh_check=False,
)
FLAGS = [
    "--num_devices",
    "2",
    "--ssh-timeout",
    "3",
    "--strict-host-keys",
    "--wait-hosts",
    "5",
    "--export-prefix",
    "NCCL_",
    "--hccl-ofi-wrapper",
    "/opt/w",
    "--launcher",
    "openmpi",
    "--launcher-args",
    "-x A",
    "--ranks",
    "1,0",
    "-m",
    "--restart-on",
    "hang",
    "--grace",
    "2.5",
    "--no-efa",
    "--master_port",
    "29500",
]


def spec_from_cli(monkeypatch, argv) -> JobSpec:
    seen = []
    monkeypatch.setattr(launch, "run_spec", lambda spec, **kw: seen.append(spec) or 0)
    assert cli.main(argv) == 0
    return seen[0]


def test_the_cli_and_the_runner_build_the_same_spec(monkeypatch):
    # ssh_check=False is --no-ssh-check; --wait-hosts needs the pre-flight, so it is checked apart
    values = dict(VALUES, ssh_check=True)
    from_runner = DistributedRunner(["pkg.train --lr 1"], **values).spec_for("pkg.train --lr 1")
    from_cli = spec_from_cli(monkeypatch, [*FLAGS, "pkg.train", "--lr", "1"])
    assert from_cli == from_runner
    for name, value in values.items():
        assert value_of(from_runner, name) == value, name


def test_the_cli_and_the_runner_build_the_same_spec_with_a_backends_options(monkeypatch):
    values = dict(backend="slurm", partition="p", time="1:00", account="acct", slurm_args="--exclusive")
    flags = ["--backend", "slurm", "--partition", "p", "--time", "1:00", "--account", "acct"]
    flags += ["--slurm-args", "--exclusive", "--num_devices", "1", "--master_port", "29500"]  # runner's defaults
    from_runner = DistributedRunner(["t.py"], **values).spec_for("t.py")
    assert spec_from_cli(monkeypatch, [*flags, "t.py"]) == from_runner
    assert from_runner.backend_options == SlurmOptions(
        partition="p", time="1:00", account="acct", slurm_args="--exclusive"
    )


def value_of(spec: JobSpec, name: str):
    """An option's value in the spec: its own field, or its backend's options."""
    return getattr(spec.options(REGISTRY[OWNER[name]]), name) if name in OWNER else getattr(spec, name)


def test_every_runner_keyword_reaches_the_spec():
    for f, _ in FIELDS:
        if f.name in VALUES and f.name not in ("hostfile", "include", "wait_hosts"):
            spec = DistributedRunner(["t.py"], **{f.name: VALUES[f.name]}).spec_for("t.py")
            assert value_of(spec, f.name) == VALUES[f.name], f.name


def test_runner_refuses_unknown_keywords_and_two_device_counts():
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_gpus'"):
        DistributedRunner(["t.py"], num_gpus=2)
    with pytest.raises(UserError, match="contradicts"):
        DistributedRunner(["t.py"], world_size=4, num_devices=2)
    assert DistributedRunner(["t.py"], world_size=2, num_devices=2).spec_for("t.py").num_devices == 2
    assert DistributedRunner(["t.py"]).spec_for("t.py").num_devices == 1  # upstream's world_size=1


def test_runner_values_are_validated_like_the_cli():
    with pytest.raises(UserError) as exc:
        DistributedRunner(["t.py"], ssh_timeout=0).spec_for("t.py")
    assert exc.value.where == "--ssh-timeout"


# ----------------------------------------------------------------------------- shell completion


def _complete(env_extra, *args, home=None):
    env = dict(os.environ, **env_extra)
    if home:
        env["HOME"] = home
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_completion_script_is_typers_and_answers_from_the_options():
    shown = _complete({}, "completion", "bash")
    assert shown.returncode == 0 and "_GAUDI_LAUNCH_COMPLETE=complete_bash" in shown.stdout
    assert shown.stdout.startswith("_gaudi_launch_completion() {") and "complete -o default -F" in shown.stdout
    for shell in ("zsh", "fish"):
        assert f"_GAUDI_LAUNCH_COMPLETE=complete_{shell}" in _complete({}, "completion", shell).stdout
    res = _complete(
        {"COMP_WORDS": "gaudi-launch --ssh-t", "COMP_CWORD": "1", "_GAUDI_LAUNCH_COMPLETE": "complete_bash"}
    )
    assert res.returncode == 0 and res.stdout.split() == ["--ssh-timeout"]
    bad = _complete({}, "completion", "tcsh")
    assert bad.returncode == 2 and "tcsh" in bad.stderr and "bash, zsh or fish" in bad.stderr
    old = _complete({"_GAUDI_LAUNCH_COMPLETE": "bash_complete"})  # a script the click-based versions installed
    assert old.returncode == 1 and "gaudi-launch completion --install" in old.stderr


def test_install_completion_writes_the_script_and_sources_it_once(tmp_path):
    for _ in range(2):
        res = _complete({}, "completion", "bash", "--install", home=str(tmp_path))
        assert res.returncode == 0, res.stderr
    script = tmp_path / ".bash_completions" / "gaudi-launch.sh"
    assert "complete_bash" in script.read_text()
    assert (tmp_path / ".bashrc").read_text() == f"source {script}\n"
