"""Issue 27 items 4 and 8 on this host: after a SIGKILLed launcher, the launcher watch of each rank
(worker.watch_launcher, the process that outlives a rank stuck in C) ends not only the rank's process
group but everything on the host that carries the job's id (a rank's setsid + double-fork daemon),
SIGTERM then SIGKILL after the grace period, and removes the job's directory there."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import alive, wait_for

DAEMON_RANK = """\
import os, signal, sys, time
out = sys.argv[1]
if os.fork() == 0:                       # double fork + setsid: out of the rank's process group
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the grace period's SIGKILL must follow
        with open(os.path.join(out, "daemon.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(out, "daemon.tmp"), os.path.join(out, "daemon.pid"))
        time.sleep(900)
    os._exit(0)
job = os.environ["GAUDI_LAUNCH_JOB_ID"]
os.makedirs(os.path.join(os.environ.get("TMPDIR", "/tmp"), "gaudi-launch-" + job), mode=0o700, exist_ok=True)
with open(os.path.join(out, "job.tmp"), "w") as f:
    f.write(job)
os.replace(os.path.join(out, "job.tmp"), os.path.join(out, "job.id"))
time.sleep(900)
"""


def test_a_ranks_daemon_and_the_job_dir_go_after_a_sigkilled_launcher(tmp_path):
    script = tmp_path / "daemon_rank.py"
    script.write_text(DAEMON_RANK)
    out = tmp_path / "out"
    out.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", "--grace", "2", str(script), str(out)],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    daemon = None
    try:
        assert wait_for(lambda: (out / "daemon.pid").exists() and (out / "job.id").exists(), timeout=60)
        daemon = int((out / "daemon.pid").read_text())
        job_dir = tmp / ("gaudi-launch-" + (out / "job.id").read_text())
        assert job_dir.is_dir()
        launcher.kill()
        launcher.wait()
        assert wait_for(lambda: not alive(daemon), timeout=40), "the rank's daemon outlived the SIGKILLed launcher"
        assert wait_for(lambda: not job_dir.exists(), timeout=10), os.listdir(tmp)
    finally:
        launcher.kill()
        launcher.wait()
        if daemon and alive(daemon):
            os.kill(daemon, 9)
