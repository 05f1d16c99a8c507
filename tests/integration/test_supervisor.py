"""The supervisor with real processes: first-failure teardown, signals, summaries, no orphans."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from gaudi_launch.process.failures import failure_excerpt, format_summary
from gaudi_launch.process.supervise import ProcSpec, Supervisor
from tests.helpers import alive, all_gone, read_pids, wait_for

RANK = os.path.join(os.path.dirname(__file__), "rank_behaviour.py")


def launch_cmd(pid_dir, *extra, num=3, grace=5):
    return [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        str(num),
        "--grace",
        str(grace),
        RANK,
        "--pid-dir",
        str(pid_dir),
        *extra,
    ]


def run_launcher(pid_dir, *extra, num=3, grace=5, timeout=60):
    return subprocess.run(
        launch_cmd(pid_dir, *extra, num=num, grace=grace), capture_output=True, text=True, timeout=timeout
    )


def test_rank_exit_code_is_the_job_exit_code_and_the_rest_is_torn_down(tmp_path):
    res = run_launcher(tmp_path, "--fail-rank", "1", "--how", "exit:3")
    assert res.returncode == 3, res.stderr
    pids = read_pids(tmp_path)
    assert len(pids) == 6  # 3 ranks + a grandchild each
    assert all_gone(pids), [p for p in pids if alive(p)]
    err = res.stderr
    assert "first failure: rank 1 on localhost" in err
    assert "exit code 3" in err
    assert "torn down as a consequence: rank 0 (killed by SIGTERM), rank 2 (killed by SIGTERM)" in err
    assert "SIGKILL after grace period" not in err  # SIGTERM was enough: done within the grace period
    assert "rank 1 about to fail (exit:3)" in err  # the failing rank's last output
    assert "[rank 0] rank 0 started" in res.stdout
    assert "Traceback" not in err


def test_summary_shows_the_failing_ranks_traceback(tmp_path):
    res = run_launcher(tmp_path, "--fail-rank", "2", "--how", "raise")
    assert res.returncode == 1
    err = res.stderr
    summary = err[err.index("gaudi-launch: job failed") :]
    assert "first failure: rank 2" in summary
    assert "| Traceback (most recent call last):" in summary
    assert "| ValueError: boom from rank 2" in summary
    assert all_gone(read_pids(tmp_path))


def test_rank_killed_by_a_signal_is_reported_by_name(tmp_path):
    res = run_launcher(tmp_path, "--fail-rank", "0", "--how", "kill9", num=2)
    assert res.returncode == 128 + signal.SIGKILL
    assert "first failure: rank 0 on localhost" in res.stderr
    assert "killed by SIGKILL" in res.stderr
    assert all_gone(read_pids(tmp_path))


def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_period(tmp_path):
    res = run_launcher(tmp_path, "--fail-rank", "0", "--how", "exit:5", "--ignore-term", num=3, grace=1)
    assert res.returncode == 5
    assert "rank 1 (SIGKILL after grace period)" in res.stderr
    assert "rank 2 (SIGKILL after grace period)" in res.stderr
    assert all_gone(read_pids(tmp_path))


def test_success_exits_zero_writes_per_rank_logs_and_ends_with_a_summary(tmp_path):
    pid_dir, log_dir = tmp_path / "pids", tmp_path / "logs"
    pid_dir.mkdir()
    began = time.monotonic()
    res = subprocess.run(
        launch_cmd(pid_dir, "--how", "ok", "--output_dir", "out/run-1", num=2)[:3]
        + ["--log-dir", str(log_dir)]
        + launch_cmd(pid_dir, "--how", "ok", "--output_dir", "out/run-1", num=2)[3:],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - began
    assert res.returncode == 0, res.stderr
    assert "job failed" not in res.stderr
    assert sorted(os.listdir(log_dir)) == ["rank-0.log", "rank-1.log"]
    assert (log_dir / "rank-1.log").read_text() == "rank 1 started\n"
    assert all_gone(read_pids(pid_dir))
    # The job's last words, as a failure's are: how it ended, how long it took, where things are.
    summary = res.stderr[res.stderr.index(" gaudi-launch: job done ") :].splitlines()
    head, wall = summary[1].split(", wall time ")
    assert head == "all 2 rank(s) on 1 host(s) ended well"
    assert 0 < float(wall.removesuffix(" s")) < took
    assert summary[2:] == [
        f"per-rank logs: {log_dir}",
        "results: out/run-1 (the script's --output_dir)",
        "exit code: 0",
        "=" * 74,
    ]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_the_launcher_tears_down_the_job_and_nothing_else(tmp_path, sig):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    launcher = subprocess.Popen(launch_cmd(tmp_path, num=3), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(read_pids(tmp_path)) == 6, timeout=60)
        pids = read_pids(tmp_path)
        assert all(alive(p) for p in pids)
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + sig
        assert all_gone(pids), [p for p in pids if alive(p)]
        assert f"the launcher received {signal.Signals(sig).name}" in err
        assert "gaudi-launch: job interrupted" in err and "job failed" not in err  # stopped, not broken
        assert alive(bystander.pid)  # nothing outside the job is touched
    finally:
        launcher.kill()
        bystander.kill()
        bystander.wait()


def test_launcher_killed_with_sigkill_leaves_no_orphan_ranks(tmp_path):
    launcher = subprocess.Popen(launch_cmd(tmp_path, num=2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: len(read_pids(tmp_path)) == 4, timeout=60)
    pids = read_pids(tmp_path)
    launcher.kill()
    launcher.wait()
    # Ranks get the parent-death signal, and the worker takes its process group down with it.
    assert all_gone(pids), [p for p in pids if alive(p)]


def test_ranks_stuck_in_c_with_the_gil_held_end_with_a_sigkilled_launcher(tmp_path):
    # A rank hung in a collective may hold the GIL in C: its SIGTERM handler and any watchdog
    # thread never run again, so only something outside its interpreter can end it.
    launcher = subprocess.Popen(
        launch_cmd(tmp_path, "--hold-gil", num=2, grace=2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert wait_for(lambda: len(read_pids(tmp_path)) == 4, timeout=60)
    pids = read_pids(tmp_path)
    time.sleep(1)  # past the pid files: in the mutex wait
    launcher.kill()
    launcher.wait()
    assert all_gone(pids, timeout=15), [p for p in pids if alive(p)]


def test_a_program_that_cannot_start_fails_with_127(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--no_python", str(tmp_path / "does-not-exist")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 127
    assert "could not start" in res.stderr
    assert "No such file or directory" in res.stderr


def test_supervisor_in_process_streams_with_prefixes_and_masks_secrets(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = "import sys; print('hello hf_secretvalue'); print('oops', file=sys.stderr)"
    specs = [
        ProcSpec(rank=r, host="localhost", argv=[sys.executable, "-c", code], env=dict(os.environ)) for r in range(2)
    ]
    result = Supervisor(
        specs, stdout=out, stderr=err, color=False, mask=lambda s: s.replace("hf_secretvalue", "***")
    ).run()
    assert result.ok and result.exit_codes == {0: 0, 1: 0}
    assert sorted(out.getvalue().splitlines()) == ["[rank 0] hello ***", "[rank 1] hello ***"]
    ranks = [line for line in err.getvalue().splitlines() if line.startswith("[rank")]
    assert sorted(ranks) == ["[rank 0] oops", "[rank 1] oops"]
    assert "exit code: 0" in err.getvalue()  # the success summary follows the ranks' lines


def test_failure_excerpt_prefers_the_last_traceback():
    tail = [
        "noise",
        "Traceback (most recent call last):",
        "  old",
        "E: 1",
        "more",
        "Traceback (most recent call last):",
        '  File "x"',
        "ValueError: new",
    ]
    assert failure_excerpt(tail) == tail[5:]
    assert failure_excerpt(["a", "b"]) == ["a", "b"]


def test_format_summary_names_root_cause_first():
    from gaudi_launch.process.failures import ProcResult, find_culprit

    first = ProcResult(1, "h1", "rank 1", 11, 3, "failed", 2.0, tail=["bad"])
    other = ProcResult(0, "h0", "rank 0", 10, -15, "torn down", 2.1)
    text = format_summary(first, find_culprit(first), [other, first], None, 3, "/logs")
    lines = text.splitlines()
    assert lines[2].startswith("first failure: rank 1 on h1 (pid 11), exit code 3")
    assert "torn down as a consequence: rank 0 (killed by SIGTERM)" in text
    assert "per-rank logs: /logs" in text and "exit code: 3" in text


def test_culprit_of_a_multi_rank_process_comes_from_the_first_error_record():
    from gaudi_launch.process.failures import ProcResult, find_culprit

    mpirun = ProcResult(
        0,
        "n0",
        "mpirun",
        5,
        1,
        "failed",
        3.0,
        tail=["x"],
        rank_hosts={0: "n0", 1: "n0", 2: "n1", 3: "n1"},
        rank_tails={2: ["working", "Traceback (most recent call last):", "ValueError: v"]},
        records=[
            {"rank": 2, "host": "n1", "exit_code": 1, "exc_type": "ValueError", "message": "v"},
            {"rank": 3, "host": "n1", "exit_code": 4},
        ],
    )
    culprit = find_culprit(mpirun)
    assert (culprit.rank, culprit.host) == (2, "n1")
    assert culprit.status == "exit code 1 (ValueError: v)"
    assert culprit.excerpt == ["Traceback (most recent call last):", "ValueError: v"]
    text = format_summary(mpirun, culprit, [mpirun], None, 1, None)
    assert "first failure: rank 2 on n1 (through mpirun, pid 5), exit code 1 (ValueError: v)" in text
    assert "also failed: rank 3" in text
    assert "torn down as a consequence: rank 0, rank 1 (stopped by mpirun)" in text
