"""A rank that ends at once, leaving behind a process it forked, does not end the job (deepspeed backend,
through the real DeepSpeed runner and launch.py, on this host).

Each rank started from a job file runs under its relay (relay.py), and its launcher watch
(worker.watch_launcher) tells "the launcher is gone" (the relay ended while the rank runs: sweep the job
id on this host) from "the rank ended" (the relay ends right after it: nothing to do). It used to know that
the rank ended from a pipe whose write end only the rank held, but a process the rank fork()s without exec
(a helper, a pool worker, a daemon that keeps its descriptors) holds that write end too: once the rank and
then its relay were gone, the watch saw the relay's pipe lose its reader first, took it for a lost launcher
and SIGTERMed every process of the job on the host, launch.py included (exit 1; in the namespace cluster,
where the hosts share one PID namespace, every host's launch.py at once). Here the forked process keeps
every descriptor for as long as the job runs, so the old watch swept the job every time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from gaudi_launch.process import worker
from tests.helpers import alive, all_gone, read_pids, wait_for
from tests.integration.test_deepspeed_backend import ROOT, job_processes

# Each rank forks a process that keeps all the rank's descriptors (no exec, no close) and lives until the
# job's final sweep ends it (it carries the job id), writes its pid and ends at once.
FORK_AND_GO = (
    "import os, sys, time\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    time.sleep(600)\n"
    "    os._exit(0)\n"
    "path = os.path.join(sys.argv[1], os.environ['RANK'])\n"
    "with open(path + '.tmp', 'w') as f:\n"
    "    f.write(str(child))\n"
    "os.replace(path + '.tmp', path + '.pid')\n"
    "print('rank', os.environ['RANK'], 'forked', flush=True)\n"
    "os._exit(0)\n"
)


def test_a_rank_gone_at_once_with_a_forked_process_left_does_not_end_the_job(tmp_path):
    script = tmp_path / "fork_and_go.py"
    script.write_text(FORK_AND_GO)
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--grace", "3", "--backend", "deepspeed"]
    res = subprocess.run([*argv, str(script), str(pids)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    forked = read_pids(str(pids))
    try:
        text = res.stdout + res.stderr
        assert "received SIGTERM" not in text, text[-4000:]  # launch.py's word when it is signalled
        assert res.returncode == 0, text[-4000:]
        assert sorted(line for line in res.stdout.splitlines() if "forked" in line) == [
            "[rank 0] rank 0 forked",
            "[rank 1] rank 1 forked",
        ]
        assert len(forked) == 2
        # what the ranks left carries the job id: the launcher's final sweep ends it
        assert all_gone(forked, timeout=20), [p for p in forked if alive(p)]
        job = re.search(r"gaudi-launch: job (\w+):", res.stderr).group(1)
        assert wait_for(lambda: not job_processes(job), timeout=20), job_processes(job)
    finally:
        for pid in forked:
            if alive(pid):
                os.kill(pid, 9)


# The same without DeepSpeed, at the watch itself: this process becomes a relay (relay.start, as the worker does
# for a rank started from a job file), its child the rank, which leads a group, starts its launcher watch, forks a
# process that keeps its descriptors and prints that process's pid. Then the rank ends at once ("exit") or stays
# ("stay") until the relay's reader (the test: the launcher) is gone.
RELAYED_RANK = """\
import os, sys, time
from gaudi_launch.process import relay, worker
relay.start("1")
os.setpgid(0, 0)
assert worker.watch_launcher(1.0, os.environ["GAUDI_LAUNCH_JOB_ID"], relayed=True)
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print("forked", child, flush=True)
if sys.argv[1] == "stay":
    time.sleep(600)
os._exit(0)
"""


def _job_env(job: str) -> dict:
    return {**os.environ, "GAUDI_LAUNCH_JOB_ID": job, "PYTHONPATH": ROOT}


@pytest.mark.parametrize("attempt", range(3))
def test_the_watch_of_a_relayed_rank_gone_at_once_leaves_the_job_alone(tmp_path, attempt):
    job = "t" + uuid.uuid4().hex[:8]
    # stands for what else of the job runs on the host (launch.py, the other ranks): carries the job id
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=_job_env(job))
    forked = None
    try:
        res = subprocess.run(
            [sys.executable, "-c", RELAYED_RANK, "exit"],
            env=_job_env(job),
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        forked = int(res.stdout.split()[-1])
        # the rank and its relay are gone; its watch, once it has decided, too (it carries the job id)
        assert wait_for(lambda: set(job_processes(job)) <= {other.pid, forked}, timeout=30), job_processes(job)
        assert alive(other.pid), "the rank's watch swept the job after the rank's own end"
        assert alive(forked)
    finally:
        for pid in (other.pid, forked):
            if pid is not None and alive(pid):
                os.kill(pid, 9)
        other.wait()


def test_the_watch_of_a_relayed_rank_still_sweeps_when_the_launcher_is_gone(tmp_path):
    job = "t" + uuid.uuid4().hex[:8]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=_job_env(job))
    rank = subprocess.Popen(
        [sys.executable, "-c", RELAYED_RANK, "stay"],
        env=_job_env(job),
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    forked = None
    try:
        forked = int(rank.stdout.readline().split()[-1])
        rank.stdout.close()  # the launcher is gone: the relay's output loses its reader, the relay ends
        rank.wait(timeout=60)
        assert wait_for(lambda: not job_processes(job), timeout=30), job_processes(job)
        assert not alive(other.pid) and not alive(forked)
    finally:
        for pid in (other.pid, forked):
            if pid is not None and alive(pid):
                os.kill(pid, 9)
        other.wait()


def test_ended_tells_a_live_process_from_a_zombie_a_reaped_one_and_a_reused_pid():
    me = worker._start_time(os.getpid())
    assert me is not None and not worker._ended(os.getpid(), me)
    assert worker._ended(os.getpid(), str(int(me) + 1))  # the same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = worker._start_time(child.pid)
    assert start is not None
    assert wait_for(lambda: worker._ended(child.pid, start), timeout=30)  # a zombie: not reaped yet
    child.wait()
    assert worker._ended(child.pid, start)
