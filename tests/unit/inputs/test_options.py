"""Options declared once (gaudi_launch/inputs/options.py): every JobSpec option is a command-line option and
a DistributedRunner keyword, with one default, and reaches the same JobSpec from both."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import click
import pytest

from gaudi_launch import cli
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.options import default_of, option_fields
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.runner import DistributedRunner

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py

FIELDS = option_fields(JobSpec)
UPSTREAM = {"master_port": 29500}  # optimum-habana's positional default, kept


def cli_params():
    return {p.name: p for p in cli.command().params}


def test_every_option_is_a_cli_option_and_a_runner_keyword_with_one_default():
    params = cli_params()
    cli_flags = {o for p in params.values() for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
    keywords = inspect.signature(DistributedRunner).parameters
    assert len(FIELDS) >= 40
    for f, option in FIELDS:
        if option.flags:
            param = params[f.name]
            flags = [*param.opts, *param.secondary_opts]
            assert set(flags) == {x for flag in option.flags for x in flag.split("/")}, f.name
            assert param.default == default_of(f), f.name
            assert param.help == option.help
        else:  # set through a command-line-only flag (--no-ssh-check, --ranks)
            assert option.via in cli_flags, f.name
        assert f.name in keywords, f.name
        assert keywords[f.name].default == UPSTREAM.get(f.name, default_of(f)), f.name
    not_options = {f.name for f in JobSpec.__dataclass_fields__.values()} - {f.name for f, _ in FIELDS}
    assert not_options == {"program", "lost_hosts"}


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
    partition="p",
    time="1:00",
    account="acct",
    slurm_args="--exclusive",
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
    "--partition",
    "p",
    "--time",
    "1:00",
    "--account",
    "acct",
    "--slurm-args",
    "--exclusive",
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
    monkeypatch.setattr(cli, "run_spec", lambda spec, **kw: seen.append(spec) or 0)
    assert cli.main(argv) == 0
    return seen[0]


def test_the_cli_and_the_runner_build_the_same_spec(monkeypatch):
    # ssh_check=False is --no-ssh-check; --wait-hosts needs the pre-flight, so it is checked apart
    values = dict(VALUES, ssh_check=True)
    from_runner = DistributedRunner(["pkg.train --lr 1"], **values).spec_for("pkg.train --lr 1")
    from_cli = spec_from_cli(monkeypatch, [*FLAGS, "pkg.train", "--lr", "1"])
    assert from_cli == from_runner
    for name, value in values.items():
        assert getattr(from_runner, name) == value, name


def test_every_runner_keyword_reaches_the_spec():
    for f, _ in FIELDS:
        if f.name in VALUES and f.name not in ("hostfile", "include", "wait_hosts"):
            spec = DistributedRunner(["t.py"], **{f.name: VALUES[f.name]}).spec_for("t.py")
            assert getattr(spec, f.name) == VALUES[f.name], f.name


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


def test_cli_options_are_click_options_with_the_old_types():
    params = cli_params()
    assert params["num_devices"].type is click.INT and params["grace"].type is click.FLOAT
    assert params["env"].multiple and params["export_prefixes"].multiple
    assert params["efa"].is_bool_flag and params["efa"].default is None


# ----------------------------------------------------------------------------- shell completion


def _complete(env_extra, *args, home=None):
    env = dict(os.environ, **env_extra)
    if home:
        env["HOME"] = home
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_completion_script_is_produced_and_answers_with_click():
    shown = _complete({}, "--show-completion", "bash")
    assert shown.returncode == 0 and "_GAUDI_LAUNCH_COMPLETE=bash_complete" in shown.stdout
    assert "complete -o nosort -F" in shown.stdout
    for shell in ("zsh", "fish"):
        assert "_GAUDI_LAUNCH_COMPLETE" in _complete({}, "--show-completion", shell).stdout
    res = _complete(
        {"COMP_WORDS": "gaudi-launch --ssh-t", "COMP_CWORD": "1", "_GAUDI_LAUNCH_COMPLETE": "bash_complete"}
    )
    assert res.returncode == 0 and res.stdout.split() == ["plain,--ssh-timeout"]
    bad = _complete({}, "--show-completion", "tcsh")
    assert bad.returncode == 2 and "tcsh" in bad.stderr and "bash, zsh or fish" in bad.stderr


def test_install_completion_writes_the_script_and_sources_it_once(tmp_path):
    for _ in range(2):
        res = _complete({}, "--install-completion", "bash", home=str(tmp_path))
        assert res.returncode == 0, res.stderr
    script = tmp_path / ".bash_completions" / "gaudi-launch.sh"
    assert "bash_complete" in script.read_text()
    assert (tmp_path / ".bashrc").read_text() == f"source {script}\n"
