"""Issue 27 item 13: a launch that never starts all its ranks is bounded. --start-timeout S: ranks not all
started (their bootstrap running) within S seconds is a launch failure (exit 127) saying which ranks
started, which did not and where, with the last output seen; the job is torn down."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gaudi_launch.backends.job import start_timeout_for
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from tests.helpers import alive, all_gone, read_pids

# An interpreter that stalls before the rank bootstrap runs, for rank 1 only (as a launcher that
# never gets a rank going), after saying so.
STALLING_PYTHON = """#!/bin/sh
if [ "$RANK" = 1 ]; then
    echo "stand-in launcher: rank 1 waits for something that never comes" >&2
    echo $$ > "{pids}/stalled.pid"
    exec sleep 600
fi
exec {python} "$@"
"""
RANK0 = """
import os, sys, time
with open(os.path.join(sys.argv[1], "rank0.pid"), "w") as f:
    f.write(str(os.getpid()))
print("rank 0 up", flush=True)
time.sleep(600)
"""


def test_ranks_not_all_started_in_time_are_a_launch_failure_naming_them(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    python = tmp_path / "stalling-python"
    python.write_text(STALLING_PYTHON.format(pids=pids, python=sys.executable))
    python.chmod(0o755)
    (tmp_path / "job.py").write_text(RANK0)
    began = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--grace", "1", "--start-timeout", "4"]
        + ["--python", str(python), "job.py", str(pids)],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    try:
        assert res.returncode == 127, res.stderr
        assert took < 60, took
        assert " gaudi-launch: launch failed " in res.stderr
        assert (
            "first failure: not every rank started within 4 s (--start-timeout): 1 of 2 did (rank 0); "
            "not started: rank 1 on localhost" in res.stderr
        ), res.stderr
        assert (
            "last output of rank 1:\n  | stand-in launcher: rank 1 waits for something that never comes" in res.stderr
        )
        assert "[rank 0] rank 0 up" in res.stdout
        assert "@@gaudi-launch" not in res.stdout + res.stderr  # the start marker is not output
        assert all_gone(read_pids(str(pids)), timeout=30)
    finally:
        for pid in read_pids(str(pids)):
            if alive(pid):
                os.kill(pid, 9)


def test_a_job_whose_ranks_all_start_runs_past_the_deadline(tmp_path):
    (tmp_path / "job.py").write_text("import time\ntime.sleep(4)\nprint('done', flush=True)\n")
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--start-timeout", "2", "job.py"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("done") == 2


def test_start_timeout_default_and_bounds():
    assert start_timeout_for(JobSpec(program=["t.py"]), "mpirun") == 900.0
    assert start_timeout_for(JobSpec(program=["t.py"]), "slurm") is None  # srun may wait in the queue
    assert start_timeout_for(JobSpec(program=["t.py"], start_timeout=30), "slurm") == 30
    assert start_timeout_for(JobSpec(program=["t.py"], start_timeout=0), "local") is None  # 0: never
    for bad in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(UserError, match="--start-timeout"):
            JobSpec(program=["t.py"], start_timeout=bad).validate()


def test_a_launcher_failing_before_any_rank_started_is_blamed_itself_not_rank_0():
    # Issue 27 item 12's second half: DeepSpeed's runner failing its own ssh check was reported as
    # "first failure: rank 0 ... (through deepspeed)" though no rank ever ran; the start markers tell.
    from gaudi_launch.process.failures import ProcResult, ProcState, find_culprit, format_summary

    why = "RuntimeError: Using hostfile at /tmp/j/hostfile but host=glds-n0 was not reachable via ssh."
    runner = ProcResult(0, "glds-n0", "deepspeed", 7, 1, ProcState.FAILED, 3.2, tail=["Traceback ...", why])
    runner.rank_hosts, runner.launcher, runner.started = {0: "glds-n0", 1: "glds-n1"}, True, []
    text = format_summary(runner, find_culprit(runner), [runner], None, 1, None)
    assert "first failure: deepspeed on glds-n0 (pid 7), exit code 1 (before any rank started) after 3.2 s" in text
    assert f"last output of deepspeed:\n  | Traceback ...\n  | {why}" in text
    assert "never started: ranks 0-1" in text and "rank 0 on" not in text and "torn down" not in text
    runner.started = [0]  # once a rank has started, the evidence points at the ranks again
    assert "first failure: rank 0 on glds-n0 (through deepspeed, pid 7)" in format_summary(
        runner, find_culprit(runner), [runner], None, 1, None
    )
