"""--max-restarts with real processes: a crashed run restarts and its loss curve continues exactly;
without restarts nothing changes; exhausted restarts return the last failure; a stop never restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import alive, all_gone, read_pids, wait_for
from tests.runtime.test_trainer import TASK

ROOT = Path(__file__).resolve().parents[2]
RANK = os.path.join(os.path.dirname(__file__), "rank_behaviour.py")

# Two ranks train the trainer tests' tiny regression (dropout: the RNG state matters) with our
# Trainer, a checkpoint every 4 steps; rank 1 dies right after step CRASH_STEP on the first attempt.
TRAIN = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    {task}
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer
    rank, crash_step = int(os.environ["RANK"]), int(os.environ.get("CRASH_STEP", "0"))
    print("attempt env", os.environ.get("TORCHELASTIC_RESTART_COUNT"), os.environ.get("GAUDI_LAUNCH_RESTART_COUNT"),
          flush=True)
    def on_step(step):
        if rank == 1 and step == crash_step and os.environ.get("GAUDI_LAUNCH_RESTART_COUNT", "0") == "0":
            print(f"rank 1 crashes after step {{step}}", flush=True)
            os._exit(9)
    a = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, learning_rate=1e-2, max_steps=24,
                          logging_steps=1, save_steps=4, save_total_limit=2, device="cpu", seed=3)
    Trainer(model(), a, train_dataset=dataset(), log=lambda s: None, on_step_end=on_step).train()
""")


def gl(*args, cwd, env=None, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args],
        capture_output=True,
        text=True,
        cwd=str(cwd),
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def jobs_started(stderr: str) -> int:
    return len(re.findall(r"gaudi-launch: job [0-9a-f]+: ", stderr))


def losses(output_dir) -> dict:
    rows = [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a replayed step: the resumed value wins


def test_a_rank_that_crashes_once_restarts_and_the_loss_curve_continues_exactly(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN.format(root=str(ROOT), task=TASK))
    ref = gl("--num_devices", "2", "--device", "cpu", "train.py", str(tmp_path / "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    res = gl(
        "--num_devices",
        "2",
        "--device",
        "cpu",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0.5",
        "train.py",
        str(tmp_path / "run"),
        cwd=tmp_path,
        env={"CRASH_STEP": "11"},
    )
    assert res.returncode == 0, res.stderr
    assert "[rank 1] rank 1 crashes after step 11" in res.stdout
    # every rank saw the attempt's number under both names
    assert res.stdout.count("attempt env 0 0") == 2 and res.stdout.count("attempt env 1 1") == 2, res.stdout
    err = res.stderr
    assert "attempt 1 failed (rank failure); restart 1 of 1 in 0.5 s" in err
    summary = err[err.index("gaudi-launch: 2 attempt(s), up to 1 restart(s)") :]
    assert "attempt 1: rank failure: rank 1 on localhost, exit code 9 after" in summary
    assert "(then 0.5 s back-off)" in summary
    assert "attempt 2: finished after" in summary
    assert "exit code: 0" in summary
    after, reference = losses(tmp_path / "run"), losses(tmp_path / "ref")
    assert sorted(after) == list(range(1, 25))
    assert after == reference  # resumed from checkpoint-8 by itself: bit-for-bit the same curve
    marks = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 8, "restart": 1} in marks


FLAKY = textwrap.dedent("""
    import os, sys
    attempt = int(os.environ.get("GAUDI_LAUNCH_RESTART_COUNT", "0"))
    if os.environ["RANK"] == "1":
        print(f"failing on attempt {attempt}", flush=True)
        sys.exit(10 + attempt)
""")


def test_without_restarts_a_failure_ends_the_job_as_before(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    res = gl("--num_devices", "2", "flaky.py", cwd=tmp_path)
    assert res.returncode == 10
    assert "first failure: rank 1 on localhost" in res.stderr
    assert jobs_started(res.stderr) == 1  # one job started
    assert "gaudi-launch: attempt" not in res.stderr and "attempt(s)" not in res.stderr  # no restart, no summary


def test_exhausted_restarts_return_the_last_failures_exit_code(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    res = gl("--num_devices", "2", "--max_restarts", "2", "--restart-backoff", "0", "flaky.py", cwd=tmp_path)
    assert res.returncode == 12, res.stderr
    assert [line for line in res.stdout.splitlines() if "failing" in line] == [
        "[rank 1] failing on attempt 0",
        "[rank 1] failing on attempt 1",
        "[rank 1] failing on attempt 2",
    ]
    err = res.stderr
    assert jobs_started(err) == 3  # three jobs, each with its own id
    summary = err[err.index("gaudi-launch: 3 attempt(s), up to 2 restart(s)") :]
    for n, code in ((1, 10), (2, 11), (3, 12)):
        assert f"attempt {n}: rank failure: rank 1 on localhost, exit code {code} after" in summary
    assert summary.rstrip().splitlines()[-2] == "exit code: 12"


def test_restart_on_leaves_other_failures_alone(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    res = gl("--num_devices", "2", "--max-restarts", "3", "--restart-on", "hang", "flaky.py", cwd=tmp_path)
    assert res.returncode == 10
    assert jobs_started(res.stderr) == 1
    assert "attempt 1: rank failure: rank 1 on localhost, exit code 10" in res.stderr
    bad = gl("--num_devices", "2", "--max-restarts", "1", "--restart-on", "rank,disk", "flaky.py", cwd=tmp_path)
    assert bad.returncode == 2 and "--restart-on: 'rank,disk'" in bad.stderr


def test_a_signal_to_the_launcher_never_restarts(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        "--grace",
        "5",
        "--max-restarts",
        "3",
        RANK,
        "--pid-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len([n for n in os.listdir(tmp_path) if n.endswith(".pid")]) == 2, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert jobs_started(err) == 1
    assert "restart 1 of" not in err
    pids = read_pids(tmp_path)
    assert all_gone(pids), [p for p in pids if alive(p)]


def test_distributed_runner_restarts_too(tmp_path, monkeypatch):
    import io

    from gaudi_launch import DistributedRunner

    (tmp_path / "flaky.py").write_text(FLAKY)
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    runner = DistributedRunner(
        ["flaky.py"], world_size=2, master_port=None, max_restarts=1, restart_backoff=0, stdout=out, stderr=err
    )
    assert runner.run() == 11  # the last attempt's code
    assert runner.result.exit_code == 11 and runner.result.culprit.rank == 1
    assert "[rank 1] failing on attempt 1" in out.getvalue()
    assert "attempt 1: rank failure: rank 1 on localhost, exit code 10" in err.getvalue()


def test_a_signal_during_the_back_off_ends_the_run_without_restarting(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--num_devices",
            "2",
            "--max-restarts",
            "3",
            "--restart-backoff",
            "60",
            "flaky.py",
        ],
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in proc.stderr:  # wait for the back-off to begin
            lines.append(line)
            if "restart 1 of 3 in 60 s" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM during the back-off: no restart" in err
    assert jobs_started(err) == 1 and "attempt 1: rank failure: rank 1 on localhost, exit code 10" in err
