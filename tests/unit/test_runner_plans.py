"""DistributedRunner (optimum-habana's entry point) as a planner: plans() starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.runner import command_to_program

REPO = Path(__file__).resolve().parents[2]
WORKER_HEAD = ["-u", "-m", "gaudi_launch.process.worker"]


pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def runner(*args, **kwargs):
    from gaudi_launch import DistributedRunner

    kwargs.setdefault("master_port", None)
    return DistributedRunner(*args, **kwargs)


def test_distributed_runner_is_exported():
    import gaudi_launch
    from gaudi_launch import DistributedRunner
    from gaudi_launch.runner import DistributedRunner as direct

    assert DistributedRunner is direct
    assert "DistributedRunner" in gaudi_launch.__all__
    with pytest.raises(AttributeError):
        gaudi_launch.no_such_name  # noqa: B018


def test_import_gaudi_launch_does_not_import_torch(tmp_path):
    code = (
        "import sys, gaudi_launch\n"
        "from gaudi_launch import DistributedRunner\n"
        "import gaudi_launch.runner, gaudi_launch.plan.planner, gaudi_launch.backends.local\n"
        "plans = DistributedRunner(['t.py --x'], world_size=2, master_port=None).plans()\n"
        "assert plans[0].world_size == 2\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'deepspeed'))\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ENV_FILE", "PYTHONPATH")}
    env.update(HOME=str(tmp_path), HABANA_VISIBLE_MODULES="0,1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "HEAVY="


def test_string_command_is_split_without_a_shell():
    (plan,) = runner(["train.py --lr 1 'a b'"], world_size=2).plans()
    assert plan.backend == "local"
    assert plan.world_size == 2
    assert plan.program == ["train.py", "--lr", "1", "a b"]
    assert [n.ranks for n in plan.nodes] == [[0, 1]]
    for i, cmd in enumerate(plan.commands):
        assert cmd.argv == [sys.executable, *WORKER_HEAD, "train.py", "--lr", "1", "a b"]
        assert cmd.env["RANK"] == str(i)
        assert cmd.env["WORLD_SIZE"] == "2"


def test_shell_metacharacters_stay_literal():
    (plan,) = runner(["train.py '$(rm -rf /)' ';' '&&' \"$HOME\""], world_size=1).plans()
    assert plan.program == ["train.py", "$(rm -rf /)", ";", "&&", "$HOME"]


def test_python3_prefix_is_the_interpreter():
    (plan,) = runner(["python3 train.py --x"], world_size=1).plans()
    argv = plan.commands[0].argv
    assert argv[0] == "python3"
    assert argv[1:] == [*WORKER_HEAD, "train.py", "--x"]
    assert plan.program == ["train.py", "--x"]


def test_python_dash_u_is_dropped_and_path_kept():
    (plan,) = runner(["/usr/bin/python3.11 -u train.py"], world_size=1).plans()
    assert plan.commands[0].argv == ["/usr/bin/python3.11", *WORKER_HEAD, "train.py"]


def test_list_command_keeps_items_exactly():
    items = ["train.py", "a b", "'q'", "--x=1 2", "", "ü"]
    (plan,) = runner([items], world_size=1).plans()
    assert plan.program == items
    assert plan.commands[0].argv[-len(items) :] == items


def test_several_commands_give_several_plans():
    plans = runner(["a.py", ["b.py", "--y"]], world_size=3).plans()
    assert [p.program for p in plans] == [["a.py"], ["b.py", "--y"]]
    assert [p.world_size for p in plans] == [3, 3]


def test_no_commands_no_plans():
    assert runner([]).plans() == []
    assert runner().plans() == []


@pytest.mark.parametrize(
    "command, expected",
    [
        ("train.py --a", (None, ["train.py", "--a"])),
        ("python train.py", ("python", ["train.py"])),
        ("python3.10 -u x.py -u", ("python3.10", ["x.py", "-u"])),
        (["/opt/bin/python", "x.py"], ("/opt/bin/python", ["x.py"])),
        ("ipython x.py", (None, ["ipython", "x.py"])),
        ("./python-wrapper.sh x", (None, ["./python-wrapper.sh", "x"])),
        ([1, "x"], (None, ["1", "x"])),
    ],
)
def test_command_to_program(command, expected):
    assert command_to_program(command) == expected


@pytest.mark.parametrize("command", ["", "   ", []])
def test_empty_command_is_user_error(command):
    with pytest.raises(UserError) as info:
        command_to_program(command)
    assert info.value.where == "command_list"


def test_use_mpi_is_mpirun(tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    (plan,) = runner(["train.py"], world_size=2, hostfile=str(hf), use_mpi=True).plans()
    assert plan.backend == "mpirun"
    assert plan.world_size == 4
    assert [n.devices for n in plan.nodes] == [[0, 1], [0, 1]]
    assert plan.commands[0].argv[0] == "mpirun"
    assert plan.master_addr == "worker-0"


def test_use_mpi_single_host():
    (plan,) = runner(["train.py"], world_size=2, use_mpi=True).plans()
    assert plan.backend == "mpirun"
    assert plan.world_size == 2


def test_use_deepspeed_is_deepspeed():
    (plan,) = runner(["train.py --z"], world_size=2, use_deepspeed=True).plans()
    assert plan.backend == "deepspeed"
    assert plan.commands[0].argv[1:3] == ["-m", "gaudi_launch.backends.ds_runner"]
    assert plan.program == ["train.py", "--z"]


def test_use_mpi_with_use_deepspeed_is_user_error():
    with pytest.raises(UserError) as info:
        runner(["train.py"], use_mpi=True, use_deepspeed=True)
    assert info.value.where == "--use_mpi"


def test_bad_input_from_python_is_a_value_error_as_upstream(tmp_path):
    # optimum-habana raises ValueError for these: `except ValueError` in callers must keep working.
    cases = [
        lambda: runner(["train.py"], use_mpi=True, use_deepspeed=True),
        lambda: runner(["train.py"], world_size=0),
        lambda: runner(["t.py"], master_port=70000).plans(),
        lambda: runner(["t.py"], hostfile=str(tmp_path / "missing")).plans(),
        lambda: runner([""]).plans(),
    ]
    for case in cases:
        with pytest.raises(ValueError) as info:
            case()
        assert isinstance(info.value, UserError) and info.value.where


def test_world_size_zero_is_user_error():
    with pytest.raises(UserError):
        runner(["train.py"], world_size=0)


def test_env_and_env_file_keywords(isolated, tmp_path):
    (isolated.cwd / ".deepspeed_env").write_text("A=cwd\nB=cwd\n")
    (plan,) = runner(["t.py"], env={"B": "kw", "HF_TOKEN": "secretvalue"}).plans()
    assert job_env(plan) == {"A": "cwd", "B": "kw", "HF_TOKEN": "secretvalue"}
    assert plan.to_dict()["env"]["HF_TOKEN"] == "***"
    only = tmp_path / "only.env"
    only.write_text("C=1\n")
    (plan,) = runner(["t.py"], env_file=str(only)).plans()
    assert job_env(plan) == {"C": "1"}


def job_env(plan) -> dict:
    """The plan's job variables but the random suffix each plan draws for its ranks' job directories."""
    return {k: v for k, v in plan.env.items() if k != "GAUDI_LAUNCH_JOB_DIR_SUFFIX"}


def test_include_keyword(tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("localhost slots=4\n")
    (plan,) = runner(["t.py"], world_size=2, hostfile=str(hf), include="localhost:1,3").plans()
    assert plan.nodes[0].devices == [1, 3]
    assert [c.env["HABANA_VISIBLE_MODULES"] for c in plan.commands] == ["1,3", "1,3"]


def test_default_world_size_is_one():
    (plan,) = runner(["t.py"]).plans()
    assert plan.world_size == 1


def test_os_environ_unchanged(isolated):
    (isolated.cwd / ".deepspeed_env").write_text("FROM_FILE=1\n")
    before = dict(os.environ)
    plans = runner(["train.py --lr 1", "python3 other.py"], world_size=2, env={"KW": "1"}, use_mpi=False).plans()
    assert len(plans) == 2
    assert dict(os.environ) == before
    assert "FROM_FILE" not in os.environ and "RANK" not in os.environ


def test_bad_master_port_is_user_error():
    r = runner(["t.py"], master_port=70000)
    with pytest.raises(UserError) as info:
        r.plans()
    assert info.value.where == "--master_port"
