"""Issue 12 items 2 and 19 on real processes, on this host: a rank whose launcher is gone ends
itself (the worker's watchdog), and the per-job directory is private, never reused, and removed at
the next start when a SIGKILLed launcher left it behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from gaudi_launch.backends.ds_runner import descendants
from tests.helpers import alive, all_gone, read_pids, wait_for

# Records its pid and a child's, then sleeps; ignores SIGTERM when told to.
SLEEPER = """\
import os, signal, subprocess, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
d = sys.argv[1]
with open(os.path.join(d, "r.tmp"), "w") as f:
    f.write(f"{os.getpid()}\\n{child.pid}\\n")
with open(os.path.join(d, "job"), "w") as f:
    f.write(os.environ.get("GAUDI_LAUNCH_JOB_ID", ""))
with open(os.path.join(d, "suffix"), "w") as f:
    f.write(os.environ.get("GAUDI_LAUNCH_JOB_DIR_SUFFIX", ""))
os.replace(os.path.join(d, "r.tmp"), os.path.join(d, "r.pid"))
time.sleep(900)
"""


def test_a_rank_whose_output_reader_is_gone_ends_its_group_even_ignoring_sigterm(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    read_end, write_end = os.pipe()
    env = {**os.environ, "GAUDI_LAUNCH_JOB_ID": "feedbeef", "GAUDI_LAUNCH_GRACE": "1", "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script), str(tmp_path), "--ignore-term"],
        stdout=write_end,
        stderr=write_end,
        env=env,
        start_new_session=True,
    )
    os.close(write_end)
    try:
        assert wait_for(lambda: os.path.exists(tmp_path / "r.pid"), timeout=60)
        pids = read_pids(str(tmp_path))
        time.sleep(0.5)
        assert all(alive(p) for p in pids)  # a living reader: nothing happens
        os.close(read_end)  # the launcher (or its ssh session) is gone
        assert all_gone(pids, timeout=1 + 10), [p for p in pids if alive(p)]
        assert proc.wait(timeout=10) == -signal.SIGKILL  # SIGTERM was ignored: SIGKILL after the grace
    finally:
        proc.kill()


def test_the_ranks_watch_is_no_descendant_of_the_rank(tmp_path):
    """ds_runner SIGKILLs every descendant when the launcher is gone; a watch below the rank died with it
    (about one run in two) and left the job's directory behind."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    read_end, write_end = os.pipe()
    env = {**os.environ, "GAUDI_LAUNCH_JOB_ID": "feedface", "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script), str(tmp_path)],
        stdout=write_end,
        stderr=write_end,
        env=env,
        start_new_session=True,
    )
    os.close(write_end)
    try:
        assert wait_for(lambda: os.path.exists(tmp_path / "r.pid"), timeout=60)
        rank, child = read_pids(str(tmp_path))
        assert rank == proc.pid
        assert descendants(rank) == [child]  # the script's own child only: the watch runs outside the tree
    finally:
        os.close(read_end)  # the reader is gone: the watch ends the rank
        assert proc.wait(timeout=30) != 0


def test_job_dir_is_private_removed_by_the_ranks_watch_after_a_sigkill_or_else_at_the_next_start(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    env = {**os.environ, "TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", "--backend", "deepspeed", "--grace", "2"]
    job = subprocess.Popen(
        [*argv, str(script), str(tmp_path)],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: os.path.exists(tmp_path / "r.pid") or job.poll() is not None, timeout=120)
        pids = read_pids(str(tmp_path))
        # the job id and the plan's random suffix (issue 36 item 4)
        job_dir = tmp / f"gaudi-launch-{(tmp_path / 'job').read_text()}-{(tmp_path / 'suffix').read_text()}"
        assert os.stat(job_dir).st_mode & 0o777 == 0o700
        assert os.stat(job_dir / "job.json").st_mode & 0o777 == 0o600
        job.kill()
        job.wait()
        assert all_gone(pids, timeout=2 + 10), [p for p in pids if alive(p)]
    finally:
        job.kill()
    # The ranks' launcher watch outlives the SIGKILLed launcher and removes the job's directory on its host.
    assert wait_for(lambda: not job_dir.exists(), timeout=10), "the watch left the job directory"
    # Were the watch killed too, the directory would stay: the next start on this host removes it.
    job_dir.mkdir(mode=0o700)
    old = time.time() - 3600
    os.utime(job_dir, (old, old))
    done = tmp_path / "done.py"
    done.write_text("print('ok')\n")
    res = subprocess.run([*argv, str(done)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not job_dir.exists()  # the next start removed the dead job's directory
    own = re.compile(r"gaudi-launch-[0-9a-f]{8}(-[0-9a-f]{16})?")
    assert not [n for n in os.listdir(tmp) if own.fullmatch(n)]  # nor kept its own


def test_a_local_job_removes_what_killed_jobs_left_and_nothing_of_a_live_one(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = [tmp / "gaudi-launch-0000dead", tmp / "gaudi-launch-0000dead-rank1-x_y9"]
    live = tmp / "gaudi-launch-0000beef"
    old = time.time() - 3600
    for d in [*dead, live]:
        d.mkdir(mode=0o700)
        os.utime(d, (old, old))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env={**os.environ, "GAUDI_LAUNCH_JOB_ID": "0000beef"}
    )
    try:
        done = tmp_path / "done.py"
        done.write_text("print('ok')\n")
        res = subprocess.run(
            [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", str(done)],
            env={**os.environ, "TMPDIR": str(tmp)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert not any(d.exists() for d in dead)
        assert live.is_dir()  # a process still carries that job's id
    finally:
        holder.kill()
        holder.wait()
