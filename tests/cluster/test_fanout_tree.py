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


def launch(cluster, *args, slots: int = 1):
    return [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        cluster.hostfile(slots=slots),
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
    # the three-pass tree (pre-flight, job, sweep: each one mpirun); the one-pass tree's tests are below
    env = cluster.env({**os.environ, "GAUDI_LAUNCH_TREE_RADIX": "2", "GAUDI_LAUNCH_TREE_PASSES": "3"})
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


# ---------------------------------------------------------------- one pass (the default tree: remote/onepass.py)


def run_job(cluster, *args, passes="1", slots: int = 1):
    env = cluster.env({**os.environ, "GAUDI_LAUNCH_TREE_RADIX": "2", "GAUDI_LAUNCH_TREE_PASSES": passes})
    argv = launch(cluster, "--backend", "mpirun", *args, slots=slots)
    return cluster.run_on(0, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_one_pass_a_hanging_host_at_depth_2_is_named_and_tried_once_and_nothing_starts(cluster, tmp_path):
    """The job's own mpirun: its hop to the hanging host names it after ConnectTimeout; OpenMPI 4 starts no rank;
    the table is completed by the tree's probe of the other hosts, without it (one connection in its queue)."""
    hung = cluster.hosts[5].sshd
    os.kill(hung.pid, signal.SIGSTOP)
    ran = tmp_path / "ran"
    try:
        res = run_job(cluster, "--no_python", "/bin/sh", "-c", f"touch {ran}-$(hostname)")
        waiting = accept_queue(cluster, 5)
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    found = rows(res.stdout + res.stderr)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert {h for h, (s, _) in found.items() if s == "failed"} == {"glt-n5"}, found
    assert "did not answer the ssh handshake" in found["glt-n5"][1].lower(), found["glt-n5"]
    assert waiting == 1, waiting
    assert list(tmp_path.iterdir()) == []
    assert "gaudi-launch: job " in res.stderr, res.stderr[-3000:]


def test_one_pass_a_dead_and_a_hanging_host_at_depth_2_are_named_and_nothing_starts(cluster, tmp_path):
    """A dead host and a hanging one: both named, exit 3 with the pre-flight's table, no user script anywhere.
    (The dead host's refusal ends mpirun's start at once, before the hanging host's hop times out: that host is
    then named by the tree's probe of the hosts left, which waits ConnectTimeout for it once.)"""
    cluster.stop_sshd(4)
    hung = cluster.hosts[6].sshd
    os.kill(hung.pid, signal.SIGSTOP)
    ran = tmp_path / "ran"
    try:
        res = run_job(cluster, "--no_python", "/bin/sh", "-c", f"touch {ran}-$(hostname)")
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        cluster.start_sshd(4)
    found = rows(res.stdout + res.stderr)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert {h for h, (s, _) in found.items() if s == "OK"} == {"glt-n0", "glt-n1", "glt-n2", "glt-n3", "glt-n5"}, found
    assert "refused" in found["glt-n4"][1].lower(), found["glt-n4"]
    assert "did not answer the ssh handshake" in found["glt-n6"][1].lower(), found["glt-n6"]
    assert list(tmp_path.iterdir()) == []
    assert "gaudi-launch: job " in res.stderr, res.stderr[-3000:]


def test_one_pass_a_failing_check_starts_no_user_script_anywhere(cluster, tmp_path):
    """Every daemon is up and every rank runs its bootstrap, but the script is missing on one host: the
    launcher's stop reaches every rank before the script; exit 3 with the pre-flight's table naming it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "job.py"
    ran = tmp_path / "ran"
    ran.mkdir()
    script.write_text(f"import socket, pathlib\npathlib.Path({str(ran)!r}, socket.gethostname()).touch()\n")
    # glt-n5 sees no script: its namespace has the directory hidden under an empty tmpfs (a per-host file system)
    subprocess.run(
        ["nsenter", "-t", str(cluster.hosts[5].sshd.pid), "-m", "mount", "-t", "tmpfs", "none", str(shared)], check=True
    )
    try:
        res = run_job(cluster, str(script))
    finally:
        subprocess.run(["nsenter", "-t", str(cluster.hosts[5].sshd.pid), "-m", "umount", str(shared)], check=False)
    found = rows(res.stdout + res.stderr)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert {h for h, (s, _) in found.items() if s == "failed"} == {"glt-n5"}, found
    assert "not found on glt-n5" in found["glt-n5"][1], found["glt-n5"]
    assert list(ran.iterdir()) == []
    # the job's mpirun was started (announced) and its ranks ran the checks: no pre-flight before it
    assert "gaudi-launch: job " in res.stderr, res.stderr[-3000:]


def test_one_pass_job_runs_with_no_login_from_the_launcher_below_depth_1_and_is_swept(cluster):
    """One mpirun in all: the hosts at depth 2 are logged into by their parents only, once each (no probe pass,
    no sweep pass: each host's last rank sweeps it); the daemons the ranks left are gone. Three ranks a host:
    the first asks the launcher, the others read the verdict it leaves (one connection a host)."""
    before = [len(logins_from(cluster, i)) for i in range(7)]
    marker = "313.75"
    res = run_job(
        cluster,
        "--no_python",
        "/bin/sh",
        "-c",
        f"setsid sleep {marker} >/dev/null 2>&1 </dev/null & hostname",
        slots=3,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert sorted(line.split()[-1] for line in res.stdout.splitlines()) == [
        f"glt-n{i}" for i in range(7) for _ in "abc"
    ]
    for i in (3, 4, 5, 6):
        new = logins_from(cluster, i)[before[i] :]
        assert len(new) == 1 and set(new) <= {"10.227.0.11", "10.227.0.12"}, (i, new)
    for i in (1, 2):
        assert logins_from(cluster, i)[before[i] :] == ["10.227.0.10"]
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert left == [], left
