"""The rule of docs/architecture.md "The plan sets, the rank sets", on real processes: the rank bootstrap, started
as each backend starts it (the local backend's per-rank environment, mpirun's, srun's), sets at its start no
variable that is not in the one list the plan prints (--dry-run --json's set_by_rank, plan/contract.py), on a
host without Gaudi and on one with the stand-in's Gaudi stack (the bridge's variables, the recipe cache, the
CPU binding's thread count)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_launch.cli import main
from gaudi_launch.wire import JOB_ID, NODE_DEVICES, RANKS_FROM
from tests.standin.fixture import STAND_IN_DIR

ROOT = Path(__file__).resolve().parents[2]
STANDIN_BIN = str(ROOT / "tests" / "standin" / "bin")
# Writes the environment it starts with: what the bootstrap left for the script.
DUMP = "import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n"


def dry_run(tmp_path: Path, *args: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--dry-run", "--json", *args])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def started_with(tmp_path: Path, env: dict, *script_args: str) -> dict:
    """The environment the script saw, the bootstrap run with ``env``."""
    (tmp_path / "dump.py").write_text(DUMP)
    seen = tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, "-u", "-m", "gaudi_launch.process.worker", str(tmp_path / "dump.py"), str(seen), *script_args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(seen.read_text())


def set_by_the_rank(before: dict, after: dict) -> set:
    return {k for k, v in after.items() if before.get(k) != v} | {k for k in before if k not in after}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """This machine, without Gaudi, its environment cleared of what a rank could set."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dump.py").write_text(DUMP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_", "HABANA_", "OMPI_", "SLURM_", "GAUDI_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "PYTHONPATH"):
        env.pop(name, None)
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    return env


def gaudi(env: dict, tmp_path: Path) -> tuple[dict, list[str]]:
    """The stand-in's Gaudi stack in a rank's environment, and script flags that make the bootstrap set the
    bridge's variables (lazy mode, int64, the autocast op lists from a gaudi config)."""
    config = tmp_path / "gcfg"
    config.mkdir()
    (config / "gaudi_config.json").write_text(
        json.dumps({"use_torch_autocast": True, "autocast_bf16_ops": ["bmm"], "autocast_fp32_ops": ["softmax"]})
    )
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join([STAND_IN_DIR, str(ROOT)]),
        "PATH": STANDIN_BIN + os.pathsep + env["PATH"],
    }
    return env, ["--bf16", "--gaudi_config_name", str(config), "--torch_compile"]


@pytest.mark.parametrize("stack", ["no_gaudi", "stand_in_gaudi"])
def test_a_local_rank_sets_only_what_the_plan_lists(host, tmp_path, stack):
    env, args = (host, []) if stack == "no_gaudi" else gaudi(host, tmp_path)
    plan = dry_run(tmp_path, "--backend", "local", "--num_devices", "2", "dump.py")
    command = plan["commands"][1]  # rank 1: the plan's own environment for it, as the local backend starts it
    before = {**env, **plan["env"], **command["env"]}
    changed = set_by_the_rank(before, started_with(tmp_path, before, str(tmp_path / "x"), *args))
    assert changed <= set(plan["set_by_rank"]), changed - set(plan["set_by_rank"])
    assert "RANK" not in changed and "MASTER_PORT" not in changed  # the plan set them: the rank leaves them
    if stack == "stand_in_gaudi":  # the rank did set the bridge's variables and its recipe cache
        assert {"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_RECIPE_CACHE_CONFIG"} <= changed


@pytest.mark.parametrize("stack", ["no_gaudi", "stand_in_gaudi"])
def test_a_rank_mpirun_starts_sets_only_what_the_plan_lists(host, tmp_path, stack):
    env, args = (host, []) if stack == "no_gaudi" else gaudi(host, tmp_path)
    (tmp_path / "hosts").write_text("localhost slots=2\n127.0.0.1 slots=2\n")
    plan = dry_run(
        tmp_path, "--backend", "mpirun", "--no-ssh-check", "--hostfile", "hosts", "--exclude", "127.0.0.1:0", "dump.py"
    )
    # what mpirun gives rank 2 (the second host's first rank), on top of the plan's variables and the job id
    ompi = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }
    before = {**env, **plan["env"], **plan["commands"][0]["env"], **ompi, JOB_ID: plan["job_id"]}
    assert NODE_DEVICES in before  # an uneven selection: each node's devices travel in the plan's variables
    after = started_with(tmp_path, before, str(tmp_path / "x"), *args)
    changed = set_by_the_rank(before, after)
    assert changed <= set(plan["set_by_rank"]), changed - set(plan["set_by_rank"])
    assert after["RANK"] == "2" and after["NODE_RANK"] == "1" and after["HABANA_VISIBLE_MODULES"] == "1"


def test_a_rank_srun_starts_sets_only_what_the_plan_lists(host, tmp_path):
    plan = dry_run(tmp_path, "--backend", "slurm", "--num_nodes", "1", "dump.py")  # from a login node
    srun = {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "1",
    }
    before = {**host, **plan["env"], **plan["commands"][0]["env"], **srun, JOB_ID: plan["job_id"]}
    assert before[RANKS_FROM] == "slurm" and "MASTER_ADDR" not in before
    after = started_with(tmp_path, before, str(tmp_path / "x"))
    changed = set_by_the_rank(before, after)
    assert changed <= set(plan["set_by_rank"]), changed - set(plan["set_by_rank"])
    assert after["MASTER_ADDR"] == "localhost"  # the step's first node, which only the rank knows
