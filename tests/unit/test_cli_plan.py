"""The gaudi-launch command line, driven in-process through ``--dry-run`` (nothing is started).

Every test runs with HOME and the working directory in tmp_path (no real ~/.deepspeed_env or
./.deepspeed_env is read) and with HABANA_VISIBLE_MODULES fixing the detected device count.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_launch import __version__
from tests.unit.cli_helpers import plan_of, run_cli, user_error

REPO = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-u", "-m", "gaudi_launch.process.worker"]
CONTRACT_KEYS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "CROSS_RANK",
    "CROSS_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GAUDI_LAUNCH_JOB_ID",
    # torchrun's other worker variables (issue 10 item 7)
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}
TOP_KEYS = {
    "backend",
    "world_size",
    "master_addr",
    "master_port",
    "nodes",
    "env",
    "commands",
    "program",
    "notes",
    "job_id",
}


pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


def job_env(plan: dict) -> dict:
    """The plan's job variables but the random suffix every plan draws for its ranks' job directories."""
    env = dict(plan["env"])
    assert len(env.pop("GAUDI_LAUNCH_JOB_DIR_SUFFIX")) == 16
    return env


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def two_hosts(tmp_path) -> str:
    return write(tmp_path / "hostfile", "worker-0 slots=4\nworker-1 slots=4\n")


@pytest.fixture
def local_hostfile(tmp_path) -> str:
    return write(tmp_path / "local-hostfile", "localhost slots=4\n")


# ----------------------------------------------------------------------------- local plans


def test_local_plan_num_devices_3(capsys):
    plan = plan_of(capsys, "--num_devices", "3", "train.py")
    assert TOP_KEYS <= set(plan)  # the documented keys (more may be added)
    assert plan["backend"] == "local"
    assert plan["world_size"] == 3
    assert plan["master_addr"] == "127.0.0.1"
    port = plan["master_port"]
    assert isinstance(port, int) and 1 <= port <= 65535
    assert plan["nodes"] == [{"host": "localhost", "node_rank": 0, "devices": [0, 1, 2], "ranks": [0, 1, 2]}]
    assert plan["program"] == ["train.py"]
    assert job_env(plan) == {}
    assert len(plan["job_id"]) == 8
    assert [c["rank"] for c in plan["commands"]] == [0, 1, 2]
    for i, cmd in enumerate(plan["commands"]):
        assert cmd["host"] == "localhost"
        assert cmd["argv"] == WORKER + ["train.py"]
        env = cmd["env"]
        assert set(env) == CONTRACT_KEYS  # devices 0-2 are the default: no *_VISIBLE_* override
        assert env["RANK"] == str(i)
        assert env["LOCAL_RANK"] == str(i)
        assert env["WORLD_SIZE"] == "3"
        assert env["LOCAL_WORLD_SIZE"] == env["LOCAL_SIZE"] == "3"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == env["CROSS_RANK"] == "0"
        assert env["CROSS_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == str(port)
        assert env["GAUDI_LAUNCH_JOB_ID"] == plan["job_id"]


def test_local_plan_uses_detected_count(capsys, monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1,2,3,4,5")
    plan = plan_of(capsys, "train.py")
    assert plan["backend"] == "local"
    assert plan["world_size"] == 6
    assert plan["nodes"][0]["ranks"] == list(range(6))
    assert any("HABANA_VISIBLE_MODULES" in n and "6" in n for n in plan["notes"])


def test_master_port_given_is_used(capsys):
    with socket.socket() as s:  # a port that is free right now
        s.bind(("", 0))
        port = s.getsockname()[1]
    plan = plan_of(capsys, "--num_devices", "2", "--master_port", port, "train.py")
    assert plan["master_port"] == port
    assert {c["env"]["MASTER_PORT"] for c in plan["commands"]} == {str(port)}


def test_master_addr_given_is_used(capsys):
    plan = plan_of(capsys, "--num_devices", "1", "--master_addr", "10.1.2.3", "--master_port", "29511", "train.py")
    assert plan["master_addr"] == "10.1.2.3"
    assert plan["master_port"] == 29511  # remote master: not checked from here
    assert plan["commands"][0]["env"]["MASTER_ADDR"] == "10.1.2.3"


# ----------------------------------------------------------------------------- hostfiles


def test_two_host_hostfile_is_mpirun(capsys, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, "train.py", "--lr", "1")
    assert plan["backend"] == "mpirun"
    assert plan["world_size"] == 8
    assert plan["master_addr"] == "worker-0"
    assert 20000 <= plan["master_port"] <= 40000  # picked; the pre-flight checks it on the master
    assert plan["nodes"] == [
        {"host": "worker-0", "node_rank": 0, "devices": [0, 1, 2, 3], "ranks": [0, 1, 2, 3]},
        {"host": "worker-1", "node_rank": 1, "devices": [0, 1, 2, 3], "ranks": [4, 5, 6, 7]},
    ]
    assert len(plan["commands"]) == 1
    cmd = plan["commands"][0]
    argv = cmd["argv"]
    assert argv[0] == "mpirun"
    assert cmd["host"] == "worker-0"
    assert cmd["rank"] is None
    assert argv[argv.index("-n") + 1] == "8"
    assert argv[argv.index("--host") + 1] == "worker-0:4,worker-1:4"
    assert argv[argv.index("--map-by") + 1] == "ppr:4:node"
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"MASTER_ADDR", "MASTER_PORT", "CROSS_SIZE", "GAUDI_LAUNCH_JOB_ID"} <= set(exported)
    assert all("=" not in name for name in exported)  # values never on the command line
    assert "gaudi_launch.process.worker" in argv
    assert argv[-3:] == ["train.py", "--lr", "1"]
    assert cmd["env"] == {
        "MASTER_ADDR": "worker-0",
        "MASTER_PORT": str(plan["master_port"]),
        "CROSS_SIZE": "2",
        "GAUDI_LAUNCH_JOB_ID": plan["job_id"],
    }


def test_mpirun_exports_env_file_and_x_names(capsys, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, "-x", "FOO=bar", "train.py")
    argv = plan["commands"][0]["argv"]
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "FOO" in exported
    assert "bar" not in argv
    assert job_env(plan) == {"FOO": "bar"}


def test_num_nodes_takes_first_hosts(capsys, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, "--num_nodes", "1", "--num_devices", "2", "train.py")
    assert plan["nodes"] == [{"host": "worker-0", "node_rank": 0, "devices": [0, 1], "ranks": [0, 1]}]
    assert plan["world_size"] == 2


def test_exclude_drops_host(capsys, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, "--exclude", "worker-0", "train.py")
    assert [n["host"] for n in plan["nodes"]] == ["worker-1"]
    assert plan["nodes"][0]["ranks"] == [0, 1, 2, 3]


def test_include_slots_on_remote_host_mpirun(capsys, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, "--include", "worker-1:1,3", "--backend", "mpirun", "train.py")
    assert plan["backend"] == "mpirun"
    assert plan["world_size"] == 2
    assert plan["master_addr"] == "worker-1"
    assert plan["nodes"] == [{"host": "worker-1", "node_rank": 0, "devices": [1, 3], "ranks": [0, 1]}]
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("-n") + 1] == "2"
    assert argv[argv.index("--host") + 1] == "worker-1:2"


def test_include_slots_on_remote_host_mpirun_reach_the_ranks(capsys, two_hosts):
    # One mpirun starts every node alike, so each node's device subset travels in one exported
    # variable that the worker turns into HABANA_VISIBLE_MODULES for its node.
    from gaudi_launch.process.worker import normalize_env

    plan = plan_of(capsys, "--hostfile", two_hosts, "--include", "worker-1:1,3", "--backend", "mpirun", "train.py")
    cmd = plan["commands"][0]
    exported = [cmd["argv"][i + 1] for i, a in enumerate(cmd["argv"]) if a == "-x"]
    assert plan["env"]["GAUDI_LAUNCH_NODE_DEVICES"] == "1,3"
    assert "GAUDI_LAUNCH_NODE_DEVICES" in exported
    rank1 = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "GAUDI_LAUNCH_NODE_DEVICES": "1,3",
    }
    env = normalize_env(rank1)
    assert (env["HABANA_VISIBLE_MODULES"], env["LOCAL_RANK"], env["NODE_RANK"]) == ("1,3", "1", "0")


def test_include_slots_on_localhost_local_backend(capsys, local_hostfile):
    plan = plan_of(capsys, "--hostfile", local_hostfile, "--include", "localhost:1,3", "--backend", "local", "train.py")
    assert plan["backend"] == "local"
    assert plan["world_size"] == 2
    assert plan["nodes"] == [{"host": "localhost", "node_rank": 0, "devices": [1, 3], "ranks": [0, 1]}]
    assert len(plan["commands"]) == 2
    for i, cmd in enumerate(plan["commands"]):
        env = cmd["env"]
        assert env["HABANA_VISIBLE_MODULES"] == "1,3"
        assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
        assert env["LOCAL_RANK"] == str(i)
        assert env["RANK"] == str(i)
        assert env["WORLD_SIZE"] == "2"


def test_localhost_hostfile_auto_is_local(capsys, local_hostfile):
    plan = plan_of(capsys, "--hostfile", local_hostfile, "train.py")
    assert plan["backend"] == "local"
    assert plan["master_addr"] == "127.0.0.1"
    assert plan["world_size"] == 4


def test_include_slots_respect_inherited_visible_modules(capsys, monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5,6,7")
    plan = plan_of(capsys, "--include", "localhost:1,3", "train.py")
    assert plan["world_size"] == 2
    assert {c["env"].get("HABANA_VISIBLE_MODULES") for c in plan["commands"]} == {"5,7"}


# ----------------------------------------------------------------------------- script argv

TRICKY_ARGS = [
    "--lr",
    "1e-4",
    "a b",
    "'q'",
    '"dq"',
    "$(rm -rf /)",
    ";",
    "&&",
    '{"a": [1, 2]}',
    "--",
    "-x",
    "--dry-run",
    "--help",
    "--num_devices=9",
    "",
    "  ",
    "tab\tnew\nline",
    "*.py",
    "`id`",
    "\\",
    "ünïcödé ✓ 日本",
]


@pytest.mark.parametrize("backend", ["local", "mpirun", "deepspeed"])
def test_script_args_pass_through_byte_exact(capsys, backend):
    plan = plan_of(capsys, "--num_devices", "2", "--backend", backend, "train.py", *TRICKY_ARGS)
    assert plan["backend"] == backend
    assert plan["program"] == ["train.py", *TRICKY_ARGS]
    assert plan["commands"]
    for cmd in plan["commands"]:
        if backend == "deepspeed":
            # DeepSpeed and pdsh re-quote arguments for a remote shell: they travel in the job file.
            assert cmd["argv"][-4:-2] == ["--module", "gaudi_launch.process.worker"]
            assert cmd["argv"][-2].startswith("--job-file=") and cmd["argv"][-1].startswith("--job-sha256=")
            assert not any(a in " ".join(cmd["argv"]) for a in TRICKY_ARGS if len(a) > 2)
        else:
            assert cmd["argv"][-len(TRICKY_ARGS) - 1 :] == ["train.py", *TRICKY_ARGS]


def test_script_args_pass_through_text_dry_run(capsys):
    rc, out, err = run_cli(capsys, "--dry-run", "--num_devices", "1", "train.py", *TRICKY_ARGS)
    assert rc == 0, err
    assert "note:" not in out
    # one command; an argument holding a newline makes it span lines, quoted
    command = out.split("commands:\n", 1)[1].split("] ", 1)[1]
    tokens = shlex.split(command)
    assert tokens[-len(TRICKY_ARGS) - 1 :] == ["train.py", *TRICKY_ARGS]


def test_options_after_script_are_not_interpreted(capsys, two_hosts):
    plan = plan_of(
        capsys,
        "--num_devices",
        "2",
        "train.py",
        "--num_devices",
        "9",
        "--backend",
        "mpirun",
        "--hostfile",
        two_hosts,
        "--json",
    )
    assert plan["world_size"] == 2
    assert plan["backend"] == "local"
    assert [n["host"] for n in plan["nodes"]] == ["localhost"]
    assert plan["program"] == [
        "train.py",
        "--num_devices",
        "9",
        "--backend",
        "mpirun",
        "--hostfile",
        two_hosts,
        "--json",
    ]


def test_double_dash_before_script(capsys):
    plan = plan_of(capsys, "--num_devices", "1", "--", "train.py", "--x", "--")
    assert plan["program"] == ["train.py", "--x", "--"]


def test_module_flag(capsys):
    for flag in ("-m", "--module"):
        plan = plan_of(capsys, "--num_devices", "2", flag, "pkg.mod", "--a", "1")
        for cmd in plan["commands"]:
            assert cmd["argv"] == WORKER + ["-m", "pkg.mod", "--a", "1"]
        assert plan["program"] == ["pkg.mod", "--a", "1"]


def test_no_python_program_runs_under_the_bootstrap_untouched(capsys):
    plan = plan_of(capsys, "--num_devices", "2", "--no_python", "./run.sh", "a b", "--c")
    head = [sys.executable, "-u", "-m", "gaudi_launch.process.worker", "--gaudi-launch-no-python"]
    assert [c["argv"] for c in plan["commands"]] == [head + ["./run.sh", "a b", "--c"]] * 2
    assert [c["env"]["RANK"] for c in plan["commands"]] == ["0", "1"]


def test_python_option_sets_interpreter(capsys):
    plan = plan_of(capsys, "--num_devices", "1", "--python", "/opt/py/bin/python3", "train.py")
    assert plan["commands"][0]["argv"] == ["/opt/py/bin/python3", "-u", "-m", "gaudi_launch.process.worker", "train.py"]


def test_module_with_no_python_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--num_devices", "1", "-m", "--no_python", "pkg")
    assert "--module" in err


def test_deepspeed_with_no_python_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--num_devices", "1", "--backend", "deepspeed", "--no_python", "./run.sh")
    assert "--no_python" in err


# ----------------------------------------------------------------------------- local rank


def test_append_local_rank(capsys):
    plan = plan_of(capsys, "--num_devices", "3", "--append-local-rank", "train.py", "--x")
    for i, cmd in enumerate(plan["commands"]):
        assert cmd["argv"] == WORKER + ["train.py", "--x", f"--local_rank={i}"]


def test_append_local_rank_underscore_spelling(capsys):
    plan = plan_of(capsys, "--num_devices", "2", "--append_local_rank", "train.py")
    assert [c["argv"][-1] for c in plan["commands"]] == ["--local_rank=0", "--local_rank=1"]


def test_default_does_not_append_local_rank(capsys):
    plain = plan_of(capsys, "--num_devices", "2", "train.py")
    compat = plan_of(capsys, "--num_devices", "2", "--no_local_rank", "train.py")
    for plan in (plain, compat):
        for cmd in plan["commands"]:
            assert not any(a.startswith("--local_rank") for a in cmd["argv"])
            assert cmd["argv"] == WORKER + ["train.py"]


def test_no_local_rank_with_append_local_rank_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--num_devices", "2", "--no_local_rank", "--append-local-rank", "train.py")
    assert "--no_local_rank" in err
    assert err.startswith("gaudi-launch: error: ")


def test_append_local_rank_with_mpirun_is_error(capsys, two_hosts):
    err = user_error(capsys, "--dry-run", "--hostfile", two_hosts, "--append-local-rank", "train.py")
    assert "--append-local-rank" in err


def test_deepspeed_append_local_rank_drops_no_local_rank(capsys):
    plan = plan_of(capsys, "--num_devices", "2", "--backend", "deepspeed", "--append-local-rank", "t.py")
    assert "--no_local_rank" not in plan["commands"][0]["argv"]


# ----------------------------------------------------------------------------- gaudi_spawn flags


@pytest.mark.parametrize(
    "flags",
    [
        ["--world_size", "4"],
        ["--world-size", "4"],
        ["--num_devices", "4"],
        ["--num-devices", "4"],
        ["--num_gpus", "4"],
        ["--nproc_per_node", "4"],
        ["--world_size", "4", "--num_devices", "4"],
    ],
)
def test_world_size_aliases(capsys, monkeypatch, flags):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1,2,3,4,5,6,7")
    plan = plan_of(capsys, *flags, "train.py")
    assert plan["world_size"] == 4
    assert plan["nodes"][0]["devices"] == [0, 1, 2, 3]


@pytest.mark.parametrize("flag", ["--use_mpi", "--use-mpi"])
def test_use_mpi(capsys, flag):
    plan = plan_of(capsys, "--num_devices", "2", flag, "train.py")
    assert plan["backend"] == "mpirun"
    assert plan["commands"][0]["argv"][0] == "mpirun"
    assert plan["world_size"] == 2


@pytest.mark.parametrize("flag", ["--use_deepspeed", "--use-deepspeed"])
def test_use_deepspeed(capsys, flag, two_hosts):
    plan = plan_of(capsys, "--hostfile", two_hosts, flag, "train.py", "--bf16")
    assert plan["backend"] == "deepspeed"
    (cmd,) = plan["commands"]
    argv = cmd["argv"]
    assert argv[1:3] == ["-m", "gaudi_launch.backends.ds_runner"]
    assert "--no_local_rank" in argv
    i = argv.index("--module")
    assert argv[i : i + 2] == ["--module", "gaudi_launch.process.worker"]
    assert argv[i + 2].startswith("--job-file=") and len(argv) == i + 4
    assert plan["program"] == ["train.py", "--bf16"]
    assert argv[argv.index("--master_addr") + 1] == "worker-0"
    assert argv[argv.index("--master_port") + 1] == str(plan["master_port"])
    assert plan["world_size"] == 8


def test_use_mpi_with_use_deepspeed_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--use_mpi", "--use_deepspeed", "train.py")
    assert "--use_mpi" in err


def test_use_mpi_contradicts_backend(capsys):
    err = user_error(capsys, "--dry-run", "--use_mpi", "--backend", "local", "train.py")
    assert "--use_mpi" in err
    assert "local" in err


def test_world_size_contradicts_num_devices(capsys):
    err = user_error(capsys, "--dry-run", "--world_size", "2", "--num_devices", "3", "train.py")
    assert "--world_size" in err
    assert "3" in err


def test_world_size_zero_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--world_size", "0", "train.py")
    assert "--world_size" in err


# ----------------------------------------------------------------------------- secrets

SECRET = "hf_supersecretvalue"


def test_secret_masked_in_json(capsys):
    rc, out, err = run_cli(
        capsys,
        "--dry-run",
        "--json",
        "--num_devices",
        "2",
        "-x",
        f"HF_TOKEN={SECRET}",
        "-x",
        "PLAIN=visible",
        "train.py",
        "--token",
        SECRET,
        f"--tok={SECRET}",
    )
    assert rc == 0, err
    assert SECRET not in out and SECRET not in err
    plan = json.loads(out)
    assert job_env(plan) == {"HF_TOKEN": "***", "PLAIN": "visible"}
    assert plan["program"] == ["train.py", "--token", "***", "--tok=***"]
    for cmd in plan["commands"]:
        assert cmd["argv"][-4:] == ["train.py", "--token", "***", "--tok=***"]


def test_secret_masked_in_text(capsys):
    rc, out, err = run_cli(
        capsys,
        "--dry-run",
        "--num_devices",
        "2",
        "-x",
        f"HF_TOKEN={SECRET}",
        "-x",
        "PLAIN=visible",
        "train.py",
        "--token",
        SECRET,
    )
    assert rc == 0, err
    assert SECRET not in out and SECRET not in err
    assert "HF_TOKEN=***" in out
    assert "PLAIN=visible" in out
    for i in (0, 1):
        line = next(x for x in out.splitlines() if f"rank {i}]" in x)
        assert shlex.split(line.split("] ", 1)[1])[-3:] == ["train.py", "--token", "***"]


def test_secret_masked_in_mpirun_plan(capsys, two_hosts):
    for extra in (["--json"], []):
        rc, out, err = run_cli(
            capsys, "--dry-run", *extra, "--hostfile", two_hosts, "-x", f"MY_API_KEY={SECRET}", "train.py", SECRET
        )
        assert rc == 0, err
        assert SECRET not in out
        assert "MY_API_KEY" in out


def test_secret_from_env_file_masked(capsys, isolated):
    (isolated.cwd / ".deepspeed_env").write_text(f"DB_PASSWORD={SECRET}\n")
    rc, out, err = run_cli(capsys, "--dry-run", "--json", "--num_devices", "1", "train.py", SECRET)
    assert rc == 0, err
    assert SECRET not in out
    assert job_env(json.loads(out)) == {"DB_PASSWORD": "***"}


def test_secret_with_quote_inside_argument_masked_in_text(capsys):
    secret = "ab'cdef"
    rc, out, err = run_cli(
        capsys, "--dry-run", "--num_devices", "1", "-x", f"HF_TOKEN={secret}", "train.py", f"--t={secret}"
    )
    assert rc == 0, err
    line = next(x for x in out.splitlines() if "rank 0]" in x)
    tokens = shlex.split(line.split("] ", 1)[1])
    assert not any(secret in t for t in tokens), tokens


# ----------------------------------------------------------------------------- env files


def test_env_files_cwd_wins_key_by_key(capsys, isolated):
    (isolated.home / ".deepspeed_env").write_text("A=home\nB=home\n")
    (isolated.cwd / ".deepspeed_env").write_text("B=cwd\nC=cwd\n")
    plan = plan_of(capsys, "--num_devices", "1", "train.py")
    assert job_env(plan) == {"A": "home", "B": "cwd", "C": "cwd"}
    note = next(n for n in plan["notes"] if n.startswith("environment files read"))
    home_file, cwd_file = str(isolated.home / ".deepspeed_env"), str(isolated.cwd / ".deepspeed_env")
    assert home_file in note and cwd_file in note
    assert note.index(home_file) < note.index(cwd_file)


def test_ds_env_file_renames_default_file(capsys, isolated, monkeypatch):
    (isolated.cwd / ".deepspeed_env").write_text("A=default\n")
    (isolated.cwd / "custom.env").write_text("A=custom\n")
    monkeypatch.setenv("DS_ENV_FILE", "custom.env")
    plan = plan_of(capsys, "--num_devices", "1", "train.py")
    assert job_env(plan) == {"A": "custom"}


def test_env_file_option_reads_only_that_file(capsys, isolated):
    (isolated.home / ".deepspeed_env").write_text("A=home\n")
    (isolated.cwd / ".deepspeed_env").write_text("B=cwd\n")
    only = write(isolated.tmp / "only.env", "C='only one'\nexport D=\"x\\ty\"\n")
    for flag in ("--env-file", "--env_file"):
        plan = plan_of(capsys, "--num_devices", "1", flag, only, "train.py")
        assert job_env(plan) == {"C": "only one", "D": "x\ty"}


def test_env_file_relative_to_cwd(capsys, isolated):
    (isolated.cwd / "rel.env").write_text("R=1\n")
    plan = plan_of(capsys, "--num_devices", "1", "--env-file", "rel.env", "train.py")
    assert job_env(plan) == {"R": "1"}


def test_missing_env_file_is_error(capsys, isolated):
    missing = str(isolated.tmp / "missing.env")
    err = user_error(capsys, "--dry-run", "--num_devices", "1", "--env-file", missing, "train.py")
    assert missing in err
    assert "--env-file" in err


def test_x_wins_over_env_files(capsys, isolated):
    (isolated.home / ".deepspeed_env").write_text("A=home\n")
    (isolated.cwd / ".deepspeed_env").write_text("A=cwd\nB=cwd\n")
    plan = plan_of(capsys, "--num_devices", "1", "-x", "A=cli", "--env", "C=x=y", "train.py")
    assert job_env(plan) == {"A": "cli", "B": "cwd", "C": "x=y"}


def test_x_later_wins(capsys):
    plan = plan_of(capsys, "--num_devices", "1", "-x", "A=1", "-x", "A=2", "train.py")
    assert job_env(plan) == {"A": "2"}


@pytest.mark.parametrize("bad", ["NOEQUALS", "1A=2", "=x", "A-B=1"])
def test_bad_x_is_error(capsys, bad):
    err = user_error(capsys, "--dry-run", "--num_devices", "1", "-x", bad, "train.py")
    assert "-x" in err


@pytest.mark.parametrize("where", ["cwd", "home", "explicit"])
def test_bad_env_file_line_is_error(capsys, isolated, where):
    text = "GOOD=1\n# comment\nthis is not an assignment\n"
    if where == "explicit":
        path = isolated.tmp / "bad.env"
        argv = ["--env-file", str(path)]
    else:
        path = getattr(isolated, where) / ".deepspeed_env"
        argv = []
    path.write_text(text)
    err = user_error(capsys, "--dry-run", "--num_devices", "1", *argv, "train.py")
    assert f"{path}:3" in err


# ----------------------------------------------------------------------------- user errors


def test_missing_explicit_hostfile(capsys, isolated):
    missing = str(isolated.tmp / "no-such-hostfile")
    err = user_error(capsys, "--dry-run", "--hostfile", missing, "train.py")
    assert f"{missing}: hostfile not found" in err
    assert "hint:" in err


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("worker-0 slots=4\nworker-0 slots=2\n", 2, "duplicate host 'worker-0'"),
        ("# head\nworker-0 slots=0\n", 2, "slots must be at least 1"),
        ("worker-0 slots=4 gpus=2\n", 1, "unknown key 'gpus'"),
        ("worker-0\n", 1, "missing slots"),
        ("worker-0 slots=x\n", 1, "slots must be a positive integer"),
        ("worker-0:22 slots=4\n", 1, "unexpected ':'"),
    ],
)
def test_bad_hostfile_line(capsys, tmp_path, text, line, words):
    hf = write(tmp_path / "hf", text)
    err = user_error(capsys, "--dry-run", "--hostfile", hf, "train.py")
    assert f"{hf}:{line}: " in err
    assert words in err


def test_empty_hostfile(capsys, tmp_path):
    hf = write(tmp_path / "hf", "# nothing here\n\n   \n")
    err = user_error(capsys, "--dry-run", "--hostfile", hf, "train.py")
    assert f"{hf}: the hostfile lists no hosts" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--include", "nohost"], ["--include", "Hostname 'nohost' not found"]),
        (["--exclude", "nohost"], ["--exclude", "Hostname 'nohost' not found"]),
        (["--include", "worker-0:4"], ["--include", "No slot 4 on host 'worker-0'"]),
        (["--include", "worker-0", "--exclude", "worker-1"], ["--include/--exclude"]),
        (["--exclude", "worker-0@worker-1"], ["--exclude", "leaves no hosts"]),
        (["--num_nodes", "3"], ["--num_nodes", "3"]),
        (["--num_nodes", "0"], ["--num_nodes"]),
        (["--num_devices", "5"], ["--num_devices", "5"]),
        (["--num_devices", "0"], ["--num_devices"]),
        (["--backend", "bogus"], ["--backend", "bogus"]),
        (["--backend", "local"], ["'worker-0' is another host"]),
        (["--grace", "-1"], ["--grace"]),
    ],
)
def test_selection_errors(capsys, two_hosts, argv, words):
    err = user_error(capsys, "--dry-run", "--hostfile", two_hosts, *argv, "train.py")
    assert err.startswith("gaudi-launch: error: ")
    for w in words:
        assert w in err


def test_local_backend_with_remote_host_names_hostfile_line(capsys, tmp_path):
    hf = write(tmp_path / "hf", "localhost slots=2\n# remote:\nworker-1 slots=2\n")
    err = user_error(capsys, "--dry-run", "--hostfile", hf, "--backend", "local", "train.py")
    assert f"{hf}:3: " in err
    assert "'worker-1'" in err


def test_mpirun_runs_uneven_nodes_by_slot_with_their_sizes(capsys, tmp_path):
    # The README's --include 'worker-0:0,1@worker-1' on the default backend: each host's slots are its
    # ranks, mapped by slot in host order; the ranks learn their node from the sizes.
    hf = write(tmp_path / "hf", "worker-0 slots=4\nworker-1 slots=4\n")
    plan = plan_of(capsys, "--hostfile", hf, "--include", "worker-0:0,1@worker-1", "train.py")
    assert plan["backend"] == "mpirun" and plan["world_size"] == 6
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("--host") + 1] == "worker-0:2,worker-1:4"
    assert argv[argv.index("--map-by") + 1] == "slot"
    assert plan["commands"][0]["env"]["GAUDI_LAUNCH_NODE_SIZES"] == "2,4"
    assert argv[argv.index("GAUDI_LAUNCH_NODE_SIZES") - 1] == "-x"
    even = plan_of(capsys, "--hostfile", hf, "--num_devices", "2", "train.py")
    argv = even["commands"][0]["argv"]
    assert argv[argv.index("--map-by") + 1] == "ppr:2:node" and "GAUDI_LAUNCH_NODE_SIZES" not in argv


def test_no_script_is_error(capsys):
    err = user_error(capsys, "--dry-run", "--num_devices", "1")
    assert "SCRIPT: no training script given" in err


def test_json_without_dry_run_is_error(capsys):
    err = user_error(capsys, "--json", "--num_devices", "1", "train.py")
    assert "--json" in err


@pytest.mark.parametrize("port", ["0", "70000", "-5"])
def test_master_port_out_of_range(capsys, port):
    err = user_error(capsys, "--dry-run", "--num_devices", "1", "--master_port", port, "train.py")
    assert "--master_port" in err
    assert port in err


def test_master_port_in_use(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        err = user_error(capsys, "--dry-run", "--num_devices", "1", "--master_port", str(port), "train.py")
    assert "--master_port" in err
    assert f"port {port} is already in use" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--num_devices", "abc", "train.py"], ["--num_devices", "abc"]),
        (["--bogus-option", "train.py"], ["--bogus-option"]),
        (["train.py", "--num_devices"], None),  # after the script: fine, not an error (checked below)
        (["--num_devices"], ["--num_devices"]),
        (["--grace", "soon", "train.py"], ["--grace"]),
    ],
)
def test_click_usage_errors(capsys, argv, words):
    if words is None:
        plan = plan_of(capsys, *argv)
        assert plan["program"] == ["train.py", "--num_devices"]
        return
    rc, out, err = run_cli(capsys, "--dry-run", *argv)
    assert rc == 2
    assert "Traceback" not in out + err
    for w in words:
        assert w in err


# ----------------------------------------------------------------------------- text, help, version


def test_text_dry_run(capsys, two_hosts):
    rc, out, err = run_cli(capsys, "--dry-run", "--hostfile", two_hosts, "train.py", "--lr", "1")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("backend: mpirun")
    assert "world size: 8" in lines[0]
    assert "master: worker-0:" in lines[0]
    node_lines = [x for x in lines if x.strip().startswith("node ")]
    assert len(node_lines) == 2
    assert "worker-0" in node_lines[0] and "ranks 0-3" in node_lines[0]
    assert "worker-1" in node_lines[1] and "ranks 4-7" in node_lines[1]
    cmd_lines = [x for x in lines if x.startswith("  [")]
    assert len(cmd_lines) == 1
    assert "mpirun" in cmd_lines[0] and "gaudi_launch.process.worker train.py --lr 1" in cmd_lines[0]
    assert any(x.startswith("note: ") for x in lines)


def test_text_dry_run_local(capsys):
    rc, out, err = run_cli(capsys, "--dry-run", "--num_devices", "2", "-x", "A=1", "train.py")
    assert rc == 0, err
    assert "backend: local" in out
    assert "devices 0-1" in out and "ranks 0-1" in out
    assert "  A=1" in out
    assert "[localhost, rank 0]" in out and "[localhost, rank 1]" in out
    assert "RANK=1 LOCAL_RANK=1" in out


def test_help(capsys):
    rc, out, err = run_cli(capsys, "--help")
    assert rc == 0
    for opt in (
        "--hostfile",
        "--include",
        "--exclude",
        "--world_size",
        "--num_devices",
        "--dry-run",
        "--use_mpi",
        "-x",
    ):
        assert opt in out
    rc2, out2, _ = run_cli(capsys, "-h")
    assert rc2 == 0 and out2 == out


def test_version(capsys):
    rc, out, err = run_cli(capsys, "--version")
    assert rc == 0
    assert out.strip() == f"gaudi-launch {__version__}"


# ----------------------------------------------------------------------------- subprocesses


def _subprocess_env(tmp_path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DS_ENV_FILE", "GAUDI_LAUNCH_DEBUG", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")
    }
    env.update(HOME=str(tmp_path), HABANA_VISIBLE_MODULES="0,1", PYTHONPATH=str(REPO))
    return env


HEAVY = ("torch", "transformers", "deepspeed")


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--dry-run", "--num_devices", "2", "x.py"], ["--dry-run", "--json", "--use_deepspeed", "x.py"]],
)
def test_launcher_imports_no_torch(tmp_path, argv):
    (tmp_path / "x.py").write_text("")  # the deepspeed plan's pre-flight checks that it exists
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gaudi_launch", *argv],
        cwd=tmp_path,
        env=_subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = [
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    assert "gaudi_launch.cli" in modules  # the import log is really there
    for line in proc.stderr.splitlines():
        for heavy in HEAVY:
            assert not line.rstrip().endswith(f"| {heavy}"), line
    assert not [m for m in modules if m.split(".")[0] in HEAVY]


def test_python_m_version(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--version"],
        cwd=tmp_path,
        env=_subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gaudi-launch {__version__}"


def test_python_m_user_error_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--dry-run", "--backend", "bogus", "x.py"],
        cwd=tmp_path,
        env=_subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("gaudi-launch: error: --backend: unknown backend 'bogus'")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_dry_run_with_a_failed_preflight_says_it_once_after_the_plan(tmp_path, as_json):
    # Issue 26: the verdict was printed twice (the plan's "pre-flight: FAILED" and a stderr line), and through
    # one pipe (2>&1 | tee: stdout block-buffered) the stderr line came before the plan. Names under .invalid
    # never resolve (RFC 6761): no network.
    (tmp_path / "hf").write_text("nohost-0.invalid slots=2\nnohost-1.invalid slots=2\n")
    env = {k: v for k, v in _subprocess_env(tmp_path).items() if k != "PYTHONUNBUFFERED"}
    argv = ["--dry-run", *(["--json"] if as_json else []), "--ssh-timeout", "1", "--hostfile", "hf", "x.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stdout[-2000:]
    assert proc.stdout.count("a real run would start nothing") == 1, proc.stdout[-3000:]
    if as_json:  # the plan as JSON, then the verdict on a line of its own
        plan, _, verdict = proc.stdout.rpartition("\ngaudi-launch: ")
        assert json.loads(plan)["preflight"]["ok"] is False
        assert verdict == "pre-flight failed: a real run would start nothing (findings in the plan)\n"
    else:  # the plan says it, once, and ends with its findings
        assert "\npre-flight: FAILED: a real run would start nothing (exit 3)\n" in proc.stdout
        assert "gaudi-launch:" not in proc.stdout
        assert proc.stdout.rstrip().endswith("or add it to /etc/hosts (or DNS) on this machine")


def test_mpirun_outside_the_system_directories_runs_with_its_prefix(capsys, tmp_path, monkeypatch):
    home = tmp_path / "openmpi"
    (home / "bin").mkdir(parents=True)
    fake = home / "bin" / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    hf = write(tmp_path / "hf", "worker-0 slots=2\nworker-1 slots=2\n")
    plan = plan_of(capsys, "--hostfile", hf, "train.py")
    assert plan["commands"][0]["argv"][:3] == [str(fake), "--prefix", str(home)]
    assert any("--prefix" in note for note in plan["notes"])
