"""The pre-flight and the start through OpenMPI's daemon tree (`--fan-out tree`, issue 34), on real sshds.

A cluster of this module's own (glt / 10.227.0.0/24) of 7 hosts; the launcher runs "on" glt-n0 and the tree's
radix is 2 (GAUDI_LAUNCH_TREE_RADIX), so mpirun starts the daemons of glt-n1 and glt-n2, which start glt-n3..n6:
depth 2. A dead host (no sshd) and a host that hangs (its sshd stopped with SIGSTOP: the kernel accepts the TCP
connection, nobody answers) both at depth 2 are named with the flat path's reasons, and the hanging host costs
ssh's ConnectTimeout once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.cluster.conftest import require_cluster_support, running
from tests.cluster.netcluster import NetCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_cluster_support()
    c = NetCluster(
        7, str(tmp_path_factory.mktemp("treecluster")), prefix="glt", subnet_octet=227, sshd_log_level="VERBOSE"
    )
    with running(c):
        yield c


def launch(cluster, *args):
    return [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        cluster.hostfile(slots=1),
        "--ssh-config",
        cluster.ssh_config,
        "--ssh-timeout",
        str(TIMEOUT),
        "--fan-out",
        "tree",
        "--grace",
        "3",
        *args,
    ]


def run(cluster, *args):
    env = cluster.env({**os.environ, "GAUDI_LAUNCH_TREE_RADIX": "2"})
    res = cluster.run_on(0, launch(cluster, *args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return res, None


def accept_queue(cluster, i) -> int:
    """Connections host i's kernel accepted for its (stopped) sshd: its listener's Recv-Q (ss -ltn)."""
    res = cluster.run_on(i, ["ss", "-Hltn", "sport = :22"], capture_output=True, text=True, check=True)
    return sum(int(line.split()[1]) for line in res.stdout.splitlines() if line.strip())


def rows(stdout_and_err: str) -> dict:
    out = {}
    for line in stdout_and_err.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].startswith("glt-n") and parts[1] in ("OK", "failed"):
            out[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def test_a_hanging_host_at_depth_2_is_named_and_tried_once(cluster):
    hung = cluster.hosts[5].sshd
    os.kill(hung.pid, signal.SIGSTOP)  # hangs: the kernel accepts the TCP connection, nobody answers
    try:
        res, _ = run(cluster, "--check-only")
        waiting = accept_queue(cluster, 5)
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    found = rows(res.stdout + res.stderr)
    assert res.returncode != 0, res.stdout + res.stderr
    assert {h for h, (s, _) in found.items() if s == "failed"} == {"glt-n5"}, found
    assert "did not answer the ssh handshake" in found["glt-n5"][1].lower(), found["glt-n5"]
    # tried once, so it cost ConnectTimeout once (not again by the flat path): one connection in its queue
    assert waiting == 1, waiting


def test_a_dead_and_a_hanging_host_at_depth_2_are_named(cluster):
    cluster.stop_sshd(4)  # dead: nothing listens
    hung = cluster.hosts[6].sshd
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        res, _ = run(cluster, "--check-only")
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        cluster.start_sshd(4)
    found = rows(res.stdout + res.stderr)
    assert res.returncode != 0, res.stdout + res.stderr
    assert {h for h, (s, _) in found.items() if s == "OK"} == {"glt-n0", "glt-n1", "glt-n2", "glt-n3", "glt-n5"}, found
    assert "refused" in found["glt-n4"][1].lower(), found["glt-n4"]
    assert "did not answer the ssh handshake" in found["glt-n6"][1].lower(), found["glt-n6"]


def logins_from(cluster, i) -> list:
    """The addresses host i's sshd accepted a key from, in order (VERBOSE: "Accepted publickey ... from ADDR")."""
    with open(cluster.hosts[i].sshd_log, errors="replace") as f:
        return [line.split(" from ", 1)[1].split()[0] for line in f if "Accepted publickey" in line]


def test_a_job_starts_and_is_swept_through_the_tree_with_no_login_from_the_launcher_below_depth_1(cluster):
    """The pre-flight, the start and the sweep: the hosts at depth 2 are only ever logged into by their parents
    (glt-n1 and glt-n2), never by the launcher on glt-n0; and the sweep
    through the tree still ends what a rank left behind there (a setsid daemon)."""
    before = [len(logins_from(cluster, i)) for i in range(7)]
    marker = "313.25"  # a daemon a rank leaves behind, on every host
    res, _ = run(
        cluster,
        "--backend",
        "mpirun",
        "--no_python",
        "/bin/sh",
        "-c",
        f"setsid sleep {marker} >/dev/null 2>&1 </dev/null & hostname",
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert sorted(line.split()[-1] for line in res.stdout.splitlines()) == [f"glt-n{i}" for i in range(7)]
    for i in (3, 4, 5, 6):  # depth 2: their parents (OpenMPI's radix routing picks which), never the launcher
        new = logins_from(cluster, i)[before[i] :]
        assert new and set(new) <= {"10.227.0.11", "10.227.0.12"}, (i, new)
    for i in (1, 2):
        assert set(logins_from(cluster, i)[before[i] :]) == {"10.227.0.10"}
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert left == [], left
