"""--hang-timeout with real processes: a rank that blocks before a collective is named, with the line
where the others wait, the stacks are kept, and nothing is left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

from tests.helpers import alive, all_gone, read_pids

# Four ranks all-reduce once per step (in train_step) with a heartbeat each; rank 3 sleeps before step 3's collective.
HANG = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    import gaudi_launch
    rank = int(os.environ["RANK"])
    with open(os.path.join(sys.argv[1], f"{rank}.pid"), "w") as f:
        f.write(f"{os.getpid()}\\n")
    dist.init_process_group("gloo")
    t = torch.ones(4)

    def train_step(step):
        if rank == 3 and step == 3:
            with open(os.path.join(sys.argv[1], "stuck-at"), "w") as f:
                f.write(str(time.time()))
            time.sleep(600)  # LINE_SLEEP
        dist.all_reduce(t)  # LINE_COLLECTIVE

    for step in range(1, 100):
        gaudi_launch.heartbeat()
        train_step(step)
        time.sleep(0.2)
""")


def line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if marker in line)


def test_a_rank_stuck_before_a_collective_is_named_with_where_the_others_wait(tmp_path):
    (tmp_path / "hang.py").write_text(HANG)
    pid_dir, log_dir = tmp_path / "pids", tmp_path / "logs"
    pid_dir.mkdir()
    started = time.time()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--num_devices",
            "4",
            "--hang-timeout",
            "20",
            "--grace",
            "5",
            "--log-dir",
            str(log_dir),
            "hang.py",
            str(pid_dir),
        ],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=180,
    )
    ended = time.time()
    assert res.returncode == 5, res.stderr
    stuck_at = float((pid_dir / "stuck-at").read_text())
    assert ended - stuck_at < 40, (ended - stuck_at, started)
    sleep_line, collective_line = line_of(HANG, "LINE_SLEEP"), line_of(HANG, "LINE_COLLECTIVE")
    err = res.stderr
    summary = err[err.index("gaudi-launch: job hung") :]
    first = re.search(r"first failure: (.*)", summary).group(1)
    assert first.startswith("no rank advanced for 2"), first
    # the frame each waits in (torch's all_reduce: its file and line) and the user's function around it
    assert re.search(
        rf"rank 3 in time.sleep from train_step\(\) at hang.py:{sleep_line}; "
        rf"ranks 0-2 in all_reduce \(distributed_c10d.py:\d+\) from train_step\(\) at hang.py:{collective_line}$",
        first,
    ), first
    assert f"rank 3 at hang.py:{sleep_line}: time.sleep(600)  # LINE_SLEEP" in summary
    stacks = [n for n in os.listdir(log_dir) if n.startswith("hang-")]
    assert len(stacks) == 1 and f"every rank's stacks: {log_dir / stacks[0]}" in summary
    text = (log_dir / stacks[0]).read_text()
    for rank in range(4):
        assert f"===== rank {rank} =====" in text
    assert text.count(f'hang.py", line {collective_line} in train_step') == 3
    assert "exit code: 5" in summary
    pids = read_pids(str(pid_dir))
    assert len(pids) == 4 and all_gone(pids), [p for p in pids if alive(p)]


# No torch: rank 0 beats and finishes; on the first attempt rank 1 beats twice, then blocks.
STALLS_ONCE = textwrap.dedent("""
    import os, sys, time
    import gaudi_launch
    rank, attempt = int(os.environ["RANK"]), os.environ.get("GAUDI_LAUNCH_RESTART_COUNT", "0")
    for step in range(3):
        gaudi_launch.heartbeat()
        if rank == 1 and step == 2 and attempt == "0":
            time.sleep(600)  # LINE_STALL
        time.sleep(0.1)
    print(f"rank {rank} done on attempt {attempt}", flush=True)
""")


def test_a_hang_restarts_with_restart_on_hang(tmp_path):
    (tmp_path / "stall.py").write_text(STALLS_ONCE)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--num_devices",
            "2",
            "--hang-timeout",
            "3",
            "--max-restarts",
            "1",
            "--restart-on",
            "hang",
            "--restart-backoff",
            "0",
            "--grace",
            "2",
            "stall.py",
        ],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "[rank 1] rank 1 done on attempt 1" in res.stdout and "rank 1 done on attempt 0" not in res.stdout
    stall = line_of(STALLS_ONCE, "LINE_STALL")
    assert "attempt 1 failed (hang); restart 1 of 1" in res.stderr
    assert re.search(
        rf"attempt 1: hang: no rank advanced for \d+ s: rank 1 in time.sleep at stall.py:{stall}", res.stderr
    ), res.stderr
    assert "attempt 2: finished" in res.stderr


def test_mpirun_ranks_on_this_host_are_watched_too(tmp_path):
    (tmp_path / "stall.py").write_text(STALLS_ONCE)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--backend",
            "mpirun",
            "--no-ssh-check",
            "--num_devices",
            "2",
            "--hang-timeout",
            "3",
            "--grace",
            "2",
            "stall.py",
        ],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=120,
    )
    assert res.returncode == 5, res.stderr
    stall = line_of(STALLS_ONCE, "LINE_STALL")
    assert re.search(
        rf"first failure: no rank advanced for \d+ s: rank 1 in time.sleep at stall.py:{stall}; "
        r"rank 0: no stack",
        res.stderr,
    ), res.stderr  # rank 0 had finished: nothing to ask
