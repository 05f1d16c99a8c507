"""The deepspeed backend behaves as the others on one host, through the real DeepSpeed runner and
launch.py (issue 10 items 3 and 10): a failing rank's exit code, which rank failed, `[rank N]` on
its lines, one log per rank, and --append-local-rank as `deepspeed` itself gives it. Remote hosts:
tests/cluster/test_deepspeed_backend.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gaudi_launch.inputs.ports import pick_free_port
from tests.helpers import alive, all_gone, read_pids, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = os.path.join(ROOT, "tests", "integration", "rank_behaviour.py")
ARGV_PROBE = (
    "import argparse, json, os, sys\n"
    "p = argparse.ArgumentParser()\n"
    "p.add_argument('--local_rank', type=int, required=True)\n"
    "a, _ = p.parse_known_args()\n"
    # One write per line: under `python -u` print() writes the text and its newline separately, and
    # two ranks sharing DeepSpeed's pipe could then interleave into one line.
    "sys.stdout.write('ARGV ' + json.dumps({'rank': os.environ['RANK'], 'local_rank': a.local_rank,"
    " 'argv': sys.argv[1:]}) + '\\n')\n"
    "sys.stdout.flush()\n"
)


def launch(*args, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--grace", "3", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def job_processes(job_id: str) -> list:
    """PIDs of live processes that carry this job's id (relays included)."""
    needle = f"GAUDI_LAUNCH_JOB_ID={job_id}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("how, code, status", [("exit:1", 1, "exit code 1"), ("kill9", 137, "killed by SIGKILL")])
def test_a_failing_rank_is_reported_as_on_the_local_backend(tmp_path, how, code, status):
    seen = {}
    for backend in ("local", "deepspeed"):
        pids, logs = tmp_path / backend / "pids", tmp_path / backend / "logs"
        pids.mkdir(parents=True)
        res = launch(
            "--backend", backend, "--log-dir", str(logs), RANK, "--pid-dir", str(pids), "--fail-rank", "1", "--how", how
        )
        text = res.stdout + res.stderr
        assert res.returncode == code, text[-4000:]
        first = re.search(r"first failure: rank (\d+) on (\S+) \(.*\), (.*) after", res.stderr)
        assert first, res.stderr[-3000:]
        out = sorted(line for line in res.stdout.splitlines() if "started" in line or "about to fail" in line)
        logged = {name: (logs / name).read_text().splitlines() for name in os.listdir(logs) if name.startswith("rank-")}
        seen[backend] = (first.groups(), out, logged)
        assert all_gone(read_pids(str(pids)), timeout=20)
        job = re.search(r"gaudi-launch: job (\w+):", res.stderr).group(1)
        assert wait_for(lambda: not job_processes(job), timeout=20), job_processes(job)
    assert seen["deepspeed"] == seen["local"]
    assert seen["local"][0] == ("1", "localhost", status)
    assert seen["local"][1] == [
        "[rank 0] rank 0 started",
        "[rank 1] rank 1 about to fail (" + how + ")",
        "[rank 1] rank 1 started",
    ]
    assert seen["local"][2] == {
        "rank-0.log": ["rank 0 started"],
        "rank-1.log": ["rank 1 started", f"rank 1 about to fail ({how})"],
    }


def test_append_local_rank_gives_the_script_what_deepspeed_gives_it(tmp_path):
    (tmp_path / "probe.py").write_text(ARGV_PROBE)
    args = ["a b", "--flag=$(x)"]
    ours = launch("--backend", "deepspeed", "--append-local-rank", "probe.py", *args, cwd=str(tmp_path))
    assert ours.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:]
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    theirs = subprocess.run(
        [deepspeed, "--num_gpus", "2", "--master_port", str(pick_free_port()), "probe.py", *args],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]

    def argvs(stdout: str) -> list:
        return sorted(
            json.dumps(json.loads(line[line.find("ARGV ") + 5 :]), sort_keys=True)
            for line in stdout.splitlines()
            if "ARGV {" in line
        )

    assert argvs(ours.stdout) == argvs(theirs.stdout)
    assert [json.loads(s) for s in argvs(ours.stdout)] == [
        {"rank": "0", "local_rank": 0, "argv": ["--local_rank=0", *args]},
        {"rank": "1", "local_rank": 1, "argv": ["--local_rank=1", *args]},
    ]
