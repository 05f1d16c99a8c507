"""Restarts across real hosts (issue 14): a host cut mid-run is left out and a spare takes its place,
on a namespace cluster of this module's own (hosts glr-n0..2). The launcher runs "on" glr-n0."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.cluster.conftest import require_cluster_support, running
from tests.cluster.netcluster import NetCluster
from tests.helpers import alive, all_gone, read_pids, wait_for

# First attempt: every rank records its pid and waits (for the cut). Later attempts: say where they ran.
JOB = textwrap.dedent("""
    import os, socket, sys, time
    attempt = os.environ["GAUDI_LAUNCH_RESTART_COUNT"]
    if attempt == "0":
        with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".pid"), "w") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(900)
    print(f"RAN rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} on {socket.gethostname()} attempt {attempt}",
          flush=True)
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_cluster_support()
    c = NetCluster(3, str(tmp_path_factory.mktemp("glrcluster")), prefix="glr", subnet_octet=220)
    with running(c):
        yield c


@pytest.mark.parametrize("backend", ["mpirun"])
def test_a_lost_host_is_replaced_by_a_spare_and_the_job_finishes(cluster, backend, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    hostfile = cluster.hostfile(slots=2, hosts=[0, 1, 2])
    argv = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        hostfile,
        "--ssh-config",
        cluster.ssh_config,
        "--backend",
        backend,
        "--grace",
        "5",
        "--max-restarts",
        "1",
        "--spare-hosts",
        "1",
        "--restart-backoff",
        "0",
        "job.py",
        str(pid_dir),
    ]
    job = cluster.popen_on(0, argv, env=cluster.env(), cwd=str(tmp_path), stdout=-1, stderr=-1, text=True)
    try:
        assert wait_for(lambda: len(read_pids(str(pid_dir))) == 4, timeout=120)
        cluster.cut_link(1)
        out, err = job.communicate(timeout=180)
    finally:
        cluster.restore_link(1)
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-4000:]
    ran = sorted(line[line.index("RAN ") :] for line in out.splitlines() if "RAN rank" in line)
    assert ran == [
        "RAN rank 0 of 4 on glr-n0 attempt 1",
        "RAN rank 1 of 4 on glr-n0 attempt 1",
        "RAN rank 2 of 4 on glr-n2 attempt 1",
        "RAN rank 3 of 4 on glr-n2 attempt 1",
    ], out[-3000:]
    assert "attempt 1: host lost: host glr-n1 stopped answering" in err
    assert "attempt 2: finished" in err
    # the cut host's ranks lost their launcher; nothing of the first attempt may stay anywhere
    assert all_gone(read_pids(str(pid_dir)), timeout=60), [p for p in read_pids(str(pid_dir)) if alive(p)]
