"""Issue 27 item 13 on real hosts: under mpirun, a rank that never starts on another host (its launch
stalls, as one attempt did for 493 s after mpirun's setpgid warning) ends the launch at --start-timeout
with exit 127, naming the rank and host and what was seen; nothing of the job stays on any host."""

from __future__ import annotations

import os
import sys
import time

from tests.cluster.test_multinode import launch_argv, run_job
from tests.helpers import alive, all_gone, read_pids

STALLING_PYTHON = """#!/bin/sh
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then
    echo "stand-in: rank 1 on $(hostname) never gets going" >&2
    echo $$ > "{pids}/stalled.pid"
    exec sleep 600
fi
exec {python} "$@"
"""


def test_a_remote_rank_that_never_starts_is_a_launch_failure_naming_it(cluster, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    python = tmp_path / "stalling-python"
    python.write_text(STALLING_PYTHON.format(pids=pids, python=sys.executable))
    python.chmod(0o755)
    (tmp_path / "job.py").write_text("import time\nprint('rank up', flush=True)\ntime.sleep(600)\n")
    res = run_job(
        cluster,
        "mpirun",
        "job.py",
        slots=1,
        cwd=str(tmp_path),
        extra=["--start-timeout", "8", "--python", str(python)],
        timeout=180,
    )
    try:
        assert res.returncode == 127, res.stdout[-2000:] + res.stderr[-3000:]
        assert (
            "first failure: not every rank started within 8 s (--start-timeout): 1 of 2 did (rank 0); "
            f"not started: rank 1 on {cluster.names[1]}" in res.stderr
        ), res.stderr[-3000:]
        assert "last output of mpirun:" in res.stderr
        assert f"stand-in: rank 1 on {cluster.names[1]} never gets going" in res.stderr
        assert "@@gaudi-launch" not in res.stdout + res.stderr
        assert all_gone(read_pids(str(pids)), timeout=30)
    finally:
        for pid in read_pids(str(pids)):
            if alive(pid):
                os.kill(pid, 9)


HANGING_ORTED = """#!/bin/sh
if [ "$(hostname)" = {host} ]; then
    echo $$ > "{pids}/orted.pid"
    exec sleep 600
fi
exec orted "$@"
"""


def test_a_daemon_that_never_starts_ends_the_launch_naming_its_host(cluster, tmp_path):
    """OpenMPI 4's daemon start on one host never returns (an orted that hangs there; OpenMPI 4's orted
    once refused root@host): no rank starts anywhere, and --start-timeout ends the launch naming that
    host. The sweep used to queue behind the hung start in that host's session: the launcher hung."""
    pids = tmp_path / "pids"
    pids.mkdir()
    orted = tmp_path / "hanging-orted"
    orted.write_text(HANGING_ORTED.format(host=cluster.names[1], pids=pids))
    orted.chmod(0o755)
    (tmp_path / "job.py").write_text("print('rank up', flush=True)\n")
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    env = {**cluster.env(), "OMPI_MCA_orte_launch_agent": str(orted)}  # mpirun's command for its daemons
    t0 = time.monotonic()
    res = cluster.run_on(
        0,
        launch_argv(cluster, "mpirun", hostfile, "job.py", extra=["--start-timeout", "8"]),
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    try:
        assert res.returncode == 127, res.stderr[-3000:]
        assert (
            "first failure: not every rank started within 8 s (--start-timeout): 0 of 2 did; not started: "
            f"ranks 0-1 on {cluster.names[0]}, {cluster.names[1]}; mpirun's daemon (orted) never started on "
            f"{cluster.names[1]}: its start there has not returned. Run `ssh {cluster.names[1]} orted --version`"
            in res.stderr
        ), res.stderr[-3000:]
        assert took < 40, took
        assert read_pids(str(pids)) and all_gone(
            read_pids(str(pids)), timeout=10
        )  # the hung start ended with the job's session
    finally:
        for pid in read_pids(str(pids)):
            if alive(pid):
                os.kill(pid, 9)
