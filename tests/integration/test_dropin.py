"""Drop-in for torchrun, DeepSpeed and gaudi_spawn users, on real processes (issue 10).

torchrun itself runs here (torch.distributed.run, from the venv's torch) beside gaudi-launch, and
what the ranks see or what the failure summary says is compared. Remote hosts: tests/cluster/test_dropin.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from gaudi_launch.inputs.ports import pick_free_port

# Launchers gaudi-launch is compared on: the local backend and mpirun on this host (the worker
# fills in the contract there, as it does for DeepSpeed's ranks).
BACKENDS = [["--backend", "local"], ["--backend", "mpirun", "--no-ssh-check"]]
IDS = ["local", "mpirun"]

# Each rank writes what it sees to a file of its own: torchrun's ranks share one stdout, and a line
# of a few KiB from each (or print()'s text and newline, two writes under PYTHONUNBUFFERED) can
# interleave there, which broke a CI run's JSON.
PROBE = """\
import json, os
import torch.distributed as dist
err = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
seen = {"env": dict(os.environ), "elastic": dist.is_torchelastic_launched(),
        "error_dir": os.path.isdir(os.path.dirname(err))}
with open("env-%s.json" % os.environ["RANK"], "w") as f:
    json.dump(seen, f)
"""

RECORD = """\
import os
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("boom on rank 1")


if __name__ == "__main__":
    main()
"""

# Set by torchrun for its own agent process (ranks inherit them): no agent here, so not ours.
AGENT_ONLY = {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
# Same meaning, a value of this job's own: compared by presence.
PER_JOB = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    # torchrun sets 1 thread per rank; gaudi-launch the rank's share of the cores (docs/migrating.md)
    "OMP_NUM_THREADS",
}


def clean_env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHELASTIC_", "ROLE_", "OMPI_", "PMIX_", "GAUDI_LAUNCH_"))
        and k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "OMP_NUM_THREADS",
            "GROUP_WORLD_SIZE",
            "CROSS_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
            "HABANA_VISIBLE_MODULES",
            "CUDA_VISIBLE_DEVICES",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        )
    }
    env.pop("_", None)
    return env


def torchrun(script, cwd, env) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(pick_free_port()),
        script,
    ]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def gaudi_launch(args, script, cwd, env) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--grace", "5", *args, script]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def rank_envs(cwd, parent: dict) -> dict:
    """rank -> (what the launcher added or changed, is_torchelastic_launched(), error file dir exists),
    from the probe's files in cwd, which are removed for the next run."""
    out = {}
    for path in sorted(cwd.glob("env-*.json")):
        seen = json.loads(path.read_text())
        path.unlink()
        added = {k: v for k, v in seen["env"].items() if parent.get(k) != v}
        out[int(added["RANK"])] = (added, seen["elastic"], seen["error_dir"])
    return out


@pytest.mark.parametrize("args", BACKENDS, ids=IDS)
def test_ranks_see_what_torchrun_gives_them(tmp_path, args):
    (tmp_path / "probe.py").write_text(PROBE)
    env = clean_env()
    theirs_run = torchrun("probe.py", tmp_path, env)
    assert theirs_run.returncode == 0, theirs_run.stderr[-3000:]
    theirs = rank_envs(tmp_path, env)
    ours_run = gaudi_launch(args, "probe.py", tmp_path, env)
    assert ours_run.returncode == 0, ours_run.stdout[-3000:] + ours_run.stderr[-3000:]
    ours = rank_envs(tmp_path, env)
    assert sorted(theirs) == sorted(ours) == [0, 1]
    for rank in (0, 1):
        t_env, t_elastic, t_dir = theirs[rank]
        o_env, o_elastic, o_dir = ours[rank]
        assert t_elastic is o_elastic is True  # torch.distributed.is_torchelastic_launched()
        assert t_dir and o_dir  # the error file's directory is there for torch's @record
        missing = set(t_env) - AGENT_ONLY - set(o_env)
        assert not missing, f"torchrun gives rank {rank} {sorted(missing)}, gaudi-launch does not"
        assert not AGENT_ONLY & set(o_env)
        same = {k: t_env[k] for k in t_env if k not in AGENT_ONLY | PER_JOB}
        assert {k: o_env[k] for k in same} == same
        assert o_env["TORCHELASTIC_RUN_ID"] == o_env["GAUDI_LAUNCH_JOB_ID"]
        # the rest of what gaudi-launch adds is DeepSpeed's aliases and its own job id
        assert {"NODE_RANK", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"} <= set(o_env)
        assert o_env["CROSS_SIZE"] == t_env["GROUP_WORLD_SIZE"] == "1"
    assert ours[0][0]["TORCHELASTIC_ERROR_FILE"] != ours[1][0]["TORCHELASTIC_ERROR_FILE"]


def torchrun_root_cause(stderr: str) -> list:
    """The traceback torchrun prints for its root-cause failure (from the rank's error file)."""
    lines = stderr.splitlines()
    start = lines.index("Root Cause (first observed failure):")
    at = next(i for i in range(start, len(lines)) if lines[i].startswith("  traceback : "))
    block = [lines[at][len("  traceback : ") :]]
    for line in lines[at + 1 :]:
        if line.startswith("=") or not line.strip():
            break
        block.append(line[2:])
    return [b.rstrip() for b in block]


def our_excerpt(stderr: str, rank: int) -> list:
    lines = stderr.splitlines()
    at = lines.index(f"last output of rank {rank}:")
    block = []
    for line in lines[at + 1 :]:
        if not line.startswith("  | "):
            break
        block.append(line[4:].rstrip())
    return block


@pytest.mark.parametrize("args", BACKENDS, ids=IDS)
def test_record_decorated_failure_is_reported_as_torchrun_reports_it(tmp_path, args):
    (tmp_path / "fail.py").write_text(RECORD)
    env = clean_env()
    theirs, ours = torchrun("fail.py", tmp_path, env), gaudi_launch(args, "fail.py", tmp_path, env)
    assert theirs.returncode == ours.returncode == 1, ours.stderr[-3000:]
    expected = torchrun_root_cause(theirs.stderr)
    assert expected[0] == "Traceback (most recent call last):" and expected[-1] == "ValueError: boom on rank 1"
    assert any("in wrapper" in line for line in expected)  # @record's own frame: from the error file
    assert f'  File "{tmp_path / "fail.py"}", line 8, in main' in expected
    assert "first failure: rank 1 on " in ours.stderr and "(ValueError: boom on rank 1)" in ours.stderr
    assert our_excerpt(ours.stderr, 1) == expected
    # each rank's private error file went with it (the failed one's and the torn-down one's)
    job = re.search(r"gaudi-launch: job (\w+):", ours.stderr).group(1)
    assert not [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"gaudi-launch-{job}-rank")]


def visible(tmp_path, args, env) -> list:
    (tmp_path / "hostfile").write_text("localhost slots=4\n")
    (tmp_path / "vis.py").write_text(
        "import json, os\n"
        "print('VIS ' + json.dumps({k: os.environ.get(k) for k in "
        "('RANK', 'LOCAL_RANK', 'HABANA_VISIBLE_MODULES', 'CUDA_VISIBLE_DEVICES')}), flush=True)\n"
    )
    argv = [sys.executable, "-m", "gaudi_launch", "--hostfile", "hostfile", *args, "vis.py"]
    res = subprocess.run(argv, cwd=tmp_path, env={**clean_env(), **env}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return sorted(
        (json.loads(line[line.find("VIS ") + 4 :]) for line in res.stdout.splitlines() if "VIS {" in line),
        key=lambda r: r["RANK"],
    )


@pytest.mark.parametrize("args", [*BACKENDS, ["--backend", "deepspeed"]], ids=[*IDS, "deepspeed"])
def test_device_subset_means_the_same_devices_under_an_inherited_restriction(tmp_path, args):
    seen = visible(
        tmp_path,
        ["--include", "localhost:1,3", *args],
        {"HABANA_VISIBLE_MODULES": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    assert seen == [
        {"RANK": str(r), "LOCAL_RANK": str(r), "HABANA_VISIBLE_MODULES": "5,7", "CUDA_VISIBLE_DEVICES": "1,3"}
        for r in (0, 1)
    ]


def test_deepspeed_keeps_an_inherited_cuda_restriction_for_whole_hosts(tmp_path):
    # DeepSpeed's runner drops CUDA_VISIBLE_DEVICES and launch.py sets 0..N-1: the ranks must still
    # get the devices this shell was restricted to, as with the other backends.
    seen = visible(tmp_path, ["--backend", "deepspeed", "--num_devices", "2"], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [(r["LOCAL_RANK"], r["CUDA_VISIBLE_DEVICES"]) for r in seen] == [("0", "4,5"), ("1", "4,5")]


def test_uneven_selection_runs_on_the_default_backend_as_under_deepspeed(tmp_path):
    (tmp_path / "hostfile").write_text("worker-0 slots=4\nworker-1 slots=4\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--hostfile",
            "hostfile",
            "--no-ssh-check",
            "--include",
            "worker-0:0,1@worker-1:2",
            "--dry-run",
            "train.py",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr  # DeepSpeed runs it; so does mpirun, by slot
    assert "mpirun" in res.stdout and "--host worker-0:2,worker-1:1" in res.stdout and "--map-by slot" in res.stdout
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--hostfile",
            "hostfile",
            "--no-ssh-check",
            "--num_nodes",
            "3",
            "--dry-run",
            "train.py",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "pass --num_nodes 2 or fewer (DeepSpeed silently runs on the 2 there are)" in res.stderr
