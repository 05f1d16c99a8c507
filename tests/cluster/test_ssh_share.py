"""One SSH handshake per host per job (issue 18): the pre-flight's ssh to each host stays open as the
job's connection (OpenSSH ControlMaster in a private directory of the job), mpirun's daemons and the
end-of-job sweep run over it, and the job closes it at the end, also when the job fails or is stopped.
One session per host, too (one login shell, as under raw mpirun): the pre-flight's session starts
mpirun's daemon there and sweeps the job at its end.

A cluster of this module's own (glc/222) whose sshd logs at VERBOSE: every handshake is one
"Accepted publickey" line, every session one "Starting session" line. The launcher runs "on" glc-n0, so glc-n1 and glc-n2 are the remote hosts."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import require_cluster_support, running
from tests.cluster.netcluster import NetCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_cluster_support()
    c = NetCluster(
        3, str(tmp_path_factory.mktemp("sharecluster")), prefix="glc", subnet_octet=222, sshd_log_level="VERBOSE"
    )
    with running(c):
        yield c


def handshakes(cluster, what: str = "Accepted publickey") -> list:
    out = []
    for h in cluster.hosts:
        with open(h.sshd_log, errors="replace") as f:
            out.append(sum(what in line for line in f))
    return out


def sessions(cluster) -> list:
    return handshakes(cluster, "Starting session: ")


def masters(job_id: str = "") -> list:
    """ssh masters still running (the pre-flight's ssh, ControlMaster=yes, or a background master
    whose title names the socket's directory), and our socket dirs."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    procs = [
        line
        for line in ps.splitlines()
        if ("ssh: " in line or "ControlMaster=yes" in line) and f"gaudi-launch-{job_id}" in line and "-ssh/" in line
    ]
    return procs + glob.glob(f"/tmp/gaudi-launch-{job_id}*-ssh")


def launch(cluster, tmp_path, *args, hosts=(0, 1, 2)):
    hostfile = cluster.hostfile(slots=1, hosts=list(hosts))
    return [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        hostfile,
        "--ssh-config",
        cluster.ssh_config,
        "--grace",
        "3",
        *args,
    ]


def job_id(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("gaudi-launch: job "):
            return line.split()[2].rstrip(":")
    raise AssertionError(f"no job line in: {stderr[-2000:]}")


def test_an_mpirun_job_makes_one_handshake_and_one_session_per_remote_host_and_closes_it(cluster, tmp_path):
    before, sessions_before = handshakes(cluster), sessions(cluster)
    res = cluster.run_on(
        0,
        launch(cluster, tmp_path, "--backend", "mpirun", "--no_python", "/bin/hostname"),
        env=cluster.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert sorted(line.split()[-1] for line in res.stdout.splitlines()) == ["glc-n0", "glc-n1", "glc-n2"]
    after = handshakes(cluster)
    # pre-flight, mpirun's daemons and the sweep: one connection to each remote host; none to host 0
    assert [a - b for a, b in zip(after, before)] == [0, 1, 1]
    # and one session (one login shell): the daemon started through the pre-flight's
    assert [a - b for a, b in zip(sessions(cluster), sessions_before)] == [0, 1, 1]
    assert masters(job_id(res.stderr)) == []


def test_a_user_rsh_agent_is_kept(cluster, tmp_path):
    """OMPI_MCA_plm_rsh_agent of the user's: mpirun's daemons go through it (here plain ssh, over the
    job's connection: still one handshake, but a session of its own per host)."""
    before, sessions_before = handshakes(cluster), sessions(cluster)
    res = cluster.run_on(
        0,
        launch(cluster, tmp_path, "--backend", "mpirun", "--no_python", "/bin/true"),
        env=cluster.env({**os.environ, "OMPI_MCA_plm_rsh_agent": "ssh"}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert [a - b for a, b in zip(handshakes(cluster), before)] == [0, 1, 1]
    assert [a - b for a, b in zip(sessions(cluster), sessions_before)] == [0, 2, 2]
    assert masters(job_id(res.stderr)) == []


def test_without_sharing_every_ssh_handshakes(cluster, tmp_path):
    """The same job with GAUDI_LAUNCH_SSH_SHARE=0: what the count above saves."""
    before = handshakes(cluster)
    res = cluster.run_on(
        0,
        launch(cluster, tmp_path, "--backend", "mpirun", "--no_python", "/bin/true"),
        env=cluster.env({**os.environ, "GAUDI_LAUNCH_SSH_SHARE": "0"}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert all(a - b >= 3 for a, b in list(zip(handshakes(cluster), before))[1:])


def test_check_only_and_a_failed_job_close_their_connections(cluster, tmp_path):
    before = set(masters())  # (others' jobs may run beside this test: only new ones count)
    res = cluster.run_on(
        0,
        launch(cluster, tmp_path, "--check-only"),
        env=cluster.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(masters()) <= before
    res = cluster.run_on(
        0,
        launch(cluster, tmp_path, "--backend", "mpirun", "--no_python", "/bin/false"),
        env=cluster.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    assert masters(job_id(res.stderr)) == []


def test_ctrl_c_closes_the_connections(cluster, tmp_path):
    proc = cluster.popen_on(
        0,
        launch(cluster, tmp_path, "--backend", "mpirun", "--no_python", "/bin/sleep", "60"),
        env=cluster.env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = proc.stderr.readline()  # "gaudi-launch: job ID: ...", once the pre-flight passed
        job = job_id(first)
        assert len([m for m in masters(job) if "ControlMaster=yes" in m]) == 2, "no connection to each remote host"
        time.sleep(2)  # mpirun's daemons up
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert masters(job) == [], err[-2000:]
