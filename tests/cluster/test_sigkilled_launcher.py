"""Issue 27 items 4 and 8 on real hosts: after a SIGKILLed launcher, nothing of the job stays on any
host: each rank's launcher watch ends what carries the job id there (a rank's setsid + double-fork
daemon on gl-n1, under mpirun and DeepSpeed's pdsh alike) and removes the job's directory (DeepSpeed's
job file, values in clear)."""

from __future__ import annotations

import os

import pytest

from tests.cluster.test_multinode import start_job
from tests.helpers import alive, all_gone, read_pids, wait_for

DAEMON_RANK = """\
import os, signal, socket, sys, time
out, rank = sys.argv[1], os.environ["RANK"]
if os.fork() == 0:                       # double fork + setsid: out of the rank's process group
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.path.join(out, f"{rank}.tmp"), "w") as f:
            f.write(f"{os.getpid()}\\n")
        os.replace(os.path.join(out, f"{rank}.tmp"), os.path.join(out, f"daemon-{rank}.pid"))
        time.sleep(900)
    os._exit(0)
with open(os.path.join(out, f"job-{rank}"), "w") as f:
    f.write(os.environ["GAUDI_LAUNCH_JOB_ID"] + " " + socket.gethostname() + " " + os.environ["GAUDI_LAUNCH_JOB_DIR_SUFFIX"])
time.sleep(900)
"""


@pytest.mark.parametrize("backend", ["mpirun", "deepspeed"])
def test_nothing_of_the_job_stays_on_any_host_after_a_sigkilled_launcher(cluster, backend, tmp_path):
    (tmp_path / "daemon_rank.py").write_text(DAEMON_RANK)
    out = tmp_path / "out"
    out.mkdir()
    job = start_job(cluster, backend, str(tmp_path / "daemon_rank.py"), str(out), slots=1, cwd=str(tmp_path))
    daemons: list = []
    try:
        assert wait_for(lambda: len(read_pids(str(out))) == 2 and len(list(out.glob("job-*"))) == 2, timeout=120)
        daemons = read_pids(str(out))
        job_id, host, suffix = (out / "job-1").read_text().split()
        assert host == cluster.names[1]
        # the hosts share this filesystem; DeepSpeed's is named with the job's random suffix too (issue 36)
        job_dir = f"/tmp/gaudi-launch-{job_id}" + (f"-{suffix}" if backend == "deepspeed" else "")
        assert backend != "deepspeed" or os.path.isdir(job_dir)
        job.kill()
        job.communicate(timeout=60)
        assert all_gone(daemons, timeout=60), [p for p in daemons if alive(p)]
        assert wait_for(lambda: not os.path.exists(job_dir), timeout=20), job_dir
    finally:
        job.kill()
        for pid in daemons:
            if alive(pid):
                os.kill(pid, 9)
