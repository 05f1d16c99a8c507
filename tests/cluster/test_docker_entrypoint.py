"""docker/entrypoint.sh proven without a Docker engine: its `worker` role runs on two hosts of the
namespace cluster and its `leader` role on a third, with the image's paths taken from environment
overrides (sshd on port 3022 inside each host, next to the cluster's own sshd on 22, which is never
touched; state, configs and keys in this module's temporary directory). A real 2-host x 2-rank job
runs through them; restarts keep host keys and access; bad input fails fast with its message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import alive, all_gone, read_pids, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")
SMOKE = os.path.join(ROOT, "scripts", "allreduce_smoke.py")
RANK = os.path.join(ROOT, "tests", "integration", "rank_behaviour.py")
PORT = 3022
LEADER, WORKERS = 0, (1, 2)

# Settings of the entrypoint that must not leak in from the environment running the tests.
_SCRUB = (
    "ROLE",
    "AUTHORIZED_KEY",
    "AUTHORIZED_KEYS_FILE",
    "HOSTFILE",
    "KNOWN_HOSTS",
    "LEADER_WAIT_SECONDS",
    "DEEPSPEED_ENV_FILE",
    "DS_ENV_FILE",
    "HCCL_SOCKET_IFNAME",
    "HCCL_OFI_WRAPPER",
    "EFA_SYSFS",
    "EFA_LIBS",
    "FI_INFO",
    "PYTHON",
    "OMPI_COMM_WORLD_SIZE",
)
_PROBE = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(1)\n"
    "try:\n    s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "except OSError:\n    sys.exit(1)\n"
)


def port_open(cluster, i, port=PORT) -> bool:
    """Does something accept TCP connections on host i's address:port (asked from inside host i)?"""
    h = cluster.hosts[i]
    r = cluster.run_on(
        i, [sys.executable, "-I", "-S", "-c", _PROBE, h.addr, str(port)], capture_output=True, timeout=15
    )
    return r.returncode == 0


def key_blob(pub_path) -> str:
    with open(pub_path) as f:
        return f.read().split()[1]


def fingerprint(pub_path) -> str:
    return subprocess.run(
        ["ssh-keygen", "-l", "-f", str(pub_path)], capture_output=True, text=True, check=True
    ).stdout.split()[1]


class Node:
    """One `entrypoint.sh worker` on a cluster host, started and stopped like a container."""

    def __init__(self, cluster, index, env, logfile):
        self.cluster, self.index, self.env, self.logfile = cluster, index, env, logfile
        self.proc = None

    @property
    def name(self):
        return self.cluster.hosts[self.index].name

    @property
    def state_dir(self):
        return self.env["SSH_STATE_DIR"]

    def log(self) -> str:
        with open(self.logfile, errors="replace") as f:
            return f.read()

    def start(self):
        with open(self.logfile, "a") as log:
            self.proc = self.cluster.popen_on(
                self.index,
                [ENTRYPOINT, "worker"],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        up = wait_for(
            lambda: self.proc.poll() is not None or port_open(self.cluster, self.index), timeout=20, interval=0.1
        )
        if self.proc.poll() is not None or not up:
            self.stop()
            raise AssertionError(f"worker on {self.name} did not come up:\n{self.log()[-3000:]}")

    def stop(self, sig=signal.SIGTERM):
        """Signal the entrypoint (sshd after its exec) and return its exit status; KILL if it lingers."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            return None
        return p.returncode


class Stack:
    def __init__(self, cluster, tmp):
        self.cluster, self.tmp = cluster, tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        # the image's `gaudi-launch` command: this interpreter's gaudi_launch
        launcher = self.bin / "gaudi-launch"
        launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m gaudi_launch "$@"\n')
        launcher.chmod(0o755)
        (tmp / "no-efa").mkdir()
        keys = tmp / "keys"
        keys.mkdir()
        self.leader_key = keys / "leader_ed25519"
        self.other_key = keys / "someone_else_ed25519"
        for k in (self.leader_key, self.other_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", k.name, "-f", str(k)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        self.leader_pub = (keys / "leader_ed25519.pub").read_text().strip()
        self.workers = {}

    def env(self, name, **extra):
        d = self.tmp / name
        (d / "home").mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUB and not k.startswith(("SSH_", "SSHD", "GAUDI_LAUNCH", "OMPI_", "PMIX_"))
        }
        env.update(
            {
                "HOME": str(d / "home"),
                "SSH_PORT": str(PORT),
                "SSHD": "/usr/sbin/sshd",
                "SSH_STATE_DIR": str(d / "state"),
                "SSHD_CONFIG_DIR": str(d / "etc"),
                "SSHD_AUTHORIZED_KEYS": str(d / "authorized_keys"),
                # pytest's tmp dirs sit under the world-writable /tmp, which sshd's StrictModes refuses
                "SSHD_STRICT_MODES": "no",
                "GAUDI_LAUNCH_CMD": str(self.bin / "gaudi-launch"),
                "PYTHON": sys.executable,
                "EFA_SYSFS": str(self.tmp / "no-efa"),
                "FI_INFO": str(self.tmp / "no-fi_info"),
            }
        )
        env.update(extra)
        return env

    def leader_env(self, name="leader", hosts=WORKERS, **extra):
        settings = {
            "SSH_IDENTITY": str(self.leader_key),
            "KNOWN_HOSTS": str(self.tmp / name / "known_hosts"),
            "HOSTFILE": self.cluster.hostfile(slots=2, hosts=list(hosts)),
        }
        settings.update(extra)
        return self.env(name, **settings)

    def run(self, i, argv, env, timeout=180):
        """Run the entrypoint on host i to its end. On a timeout it gets SIGTERM (which it forwards),
        then its whole process group (its sshd, gaudi-launch) SIGKILL: nothing outlives a failed test."""
        p = self.cluster.popen_on(
            i,
            [ENTRYPOINT, *argv],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate(timeout=15)
            raise AssertionError(f"entrypoint {argv[0]} on host {i} ran past {timeout} s:\n{err[-3000:]}")
        # (anything of its group still alive would hold the pipes open: communicate() returned, so none is)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    s = Stack(cluster, tmp_path_factory.mktemp("docker-entrypoint"))
    # worker 1 gets the leader's key in AUTHORIZED_KEY, worker 2 as a mounted file, next to a key that
    # was there before and must stay
    w1 = s.env(f"worker{WORKERS[0]}", AUTHORIZED_KEY=s.leader_pub)
    mounted = s.tmp / "mounted-leader.pub"
    mounted.write_text(s.leader_pub + "\n")
    w2 = s.env(f"worker{WORKERS[1]}", AUTHORIZED_KEYS_FILE=str(mounted))
    with open(w2["SSHD_AUTHORIZED_KEYS"], "w") as f:
        f.write((s.tmp / "keys" / "someone_else_ed25519.pub").read_text().strip())  # no final newline
    try:
        for i, env in zip(WORKERS, (w1, w2)):
            s.workers[i] = Node(cluster, i, env, str(s.tmp / f"worker{i}.log"))
            s.workers[i].start()
        yield s
    finally:
        for node in s.workers.values():
            node.stop()
    for i in (LEADER, *WORKERS):
        assert not port_open(cluster, i), f"something still listens on {cluster.hosts[i].name}:{PORT}"


def test_leader_runs_a_two_host_job_through_the_workers(stack, tmp_path):
    c = stack.cluster
    env = stack.leader_env(HCCL_OFI_WRAPPER="/opt/test/hccl_ofi_wrapper", LEADER_WAIT_SECONDS="30")
    ds_env = os.path.join(env["HOME"], ".deepspeed_env")
    with open(ds_env, "w") as f:
        f.write("# mine\nKEEP_ME=yes\n")

    res = stack.run(LEADER, ["leader", "--grace", "5", SMOKE], env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    ok = [line for line in res.stdout.splitlines() if "all_reduce sum = 10, expected 10: OK" in line]
    assert len(ok) == 4, out[-4000:]
    for i in WORKERS:
        name = c.hosts[i].name
        assert sum(f" on {name} " in line for line in ok) == 2
        assert f"{name}:{PORT} answers" in res.stderr
        # its host key, as generated in its state dir, is what the leader recorded
        blob = key_blob(os.path.join(stack.workers[i].state_dir, "ssh_host_ed25519_key.pub"))
        with open(env["KNOWN_HOSTS"]) as f:
            assert any(line.startswith(f"[{name}]:{PORT} ") and blob in line for line in f), name
    assert f" on {c.hosts[LEADER].name} " not in "".join(ok)

    # EFA is the launcher's (one rule with bare hosts): the user's .deepspeed_env is never rewritten,
    # the interface is the one on the master's subnet, the wrapper comes from the image's HCCL_OFI_WRAPPER
    with open(ds_env) as f:
        assert f.read() == "# mine\nKEEP_ME=yes\n"
    res = stack.run(LEADER, ["leader", "--efa", "--dry-run", SMOKE], env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "  HCCL_OVER_OFI=1" in res.stdout
        and "  HCCL_SOCKET_IFNAME=eth0" in res.stdout
        and "  KEEP_ME=yes" in res.stdout
    )
    assert "  LD_LIBRARY_PATH=/opt/test/hccl_ofi_wrapper:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib" in res.stdout

    # the key that was in worker 2's authorized_keys is still there, the leader's was added once
    with open(stack.workers[WORKERS[1]].env["SSHD_AUTHORIZED_KEYS"]) as f:
        text = f.read()
    assert text.count(key_blob(stack.tmp / "keys" / "someone_else_ed25519.pub")) == 1
    assert text.count(stack.leader_pub.split()[1]) == 1
    assert all(len(line.split()) >= 2 for line in text.splitlines())  # the old last line was not glued to ours
    assert not port_open(c, LEADER), "the leader's sshd outlived it"


def test_worker_restart_keeps_host_key_and_leader_access(stack, tmp_path):
    c, node = stack.cluster, stack.workers[WORKERS[0]]
    pub = os.path.join(node.state_dir, "ssh_host_ed25519_key.pub")
    before = fingerprint(pub)
    known = tmp_path / "known_hosts"
    scan = c.run_on(LEADER, ["ssh-keyscan", "-p", str(PORT), node.name], capture_output=True, text=True, timeout=30)
    known.write_text(scan.stdout)
    assert key_blob(pub) in scan.stdout

    assert node.stop(signal.SIGTERM) == 0  # sshd's own status for SIGTERM, through the exec
    assert not port_open(c, node.index)
    node.start()  # same state dir, same AUTHORIZED_KEY
    assert fingerprint(pub) == before
    assert "host key kept" in node.log()
    with open(node.env["SSHD_AUTHORIZED_KEYS"]) as f:
        assert f.read().count(stack.leader_pub.split()[1]) == 1, "the leader's key was appended again"

    # The leader gets in with host keys recorded before the restart, refusing any other: the
    # pre-flight (`check` role) with --strict-host-keys, and plain ssh with the config it wrote.
    env = stack.leader_env("checker", KNOWN_HOSTS=str(known), hosts=[node.index])
    res = stack.run(LEADER, ["check", "--strict-host-keys"], env, timeout=60)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert node.name in res.stdout
    r = c.run_on(
        LEADER,
        [
            "ssh",
            "-F",
            os.path.join(env["SSHD_CONFIG_DIR"], "ssh_config"),
            "-o",
            "StrictHostKeyChecking=yes",
            node.name,
            "hostname",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and r.stdout.strip() == node.name, r.stderr


@pytest.mark.parametrize("case", ["none", "empty", "missing-file", "private", "garbage"])
def test_worker_without_a_usable_key_fails_fast(stack, case):
    extra = {"SSH_PORT": "3023"}
    if case == "empty":
        extra["AUTHORIZED_KEY"] = ""
    elif case == "missing-file":
        extra["AUTHORIZED_KEYS_FILE"] = str(stack.tmp / "nowhere" / "leader.pub")
    elif case == "private":
        extra["AUTHORIZED_KEY"] = stack.leader_key.read_text()
    elif case == "garbage":
        extra["AUTHORIZED_KEY"] = "ssh-ed25519 not-a-key"
    env = stack.env(f"bad-{case}", **extra)
    t0 = time.monotonic()
    res = stack.run(WORKERS[1], ["worker"], env, timeout=30)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - t0 < 10
    expected = {
        "none": "no authorized key",
        "empty": "AUTHORIZED_KEY is set but empty",
        "missing-file": f"AUTHORIZED_KEYS_FILE={extra.get('AUTHORIZED_KEYS_FILE')} does not exist",
        "private": "holds a PRIVATE key",
        "garbage": "is not an SSH public key",
    }[case]
    assert expected in res.stderr
    assert "starting sshd" not in res.stderr
    assert not port_open(stack.cluster, WORKERS[1], 3023)
    assert stack.leader_key.read_text().split("\n")[1] not in res.stderr  # a private key is never echoed


@pytest.mark.parametrize("case", ["no-hostfile", "bad-hostfile"])
def test_leader_with_a_bad_hostfile_fails_before_starting_anything(stack, tmp_path, case):
    hostfile = tmp_path / "hostfile"
    if case == "bad-hostfile":
        hostfile.write_text("gl-n1 slots=2\ngl-n2 slots=two\n")
    env = stack.leader_env("leader-bad", HOSTFILE=str(hostfile))
    res = stack.run(LEADER, ["leader", SMOKE], env, timeout=30)
    assert res.returncode == 2, res.stderr
    if case == "no-hostfile":
        assert f"no hostfile at HOSTFILE={hostfile}" in res.stderr
    else:
        assert f"{hostfile}:2:" in res.stderr
    assert "sshd listening" not in res.stderr and "running:" not in res.stderr


def test_unreachable_worker_is_named_after_the_bounded_wait(stack):
    c, node = stack.cluster, stack.workers[WORKERS[1]]
    node.stop()
    try:
        # no leader key yet: the leader makes one and prints its public half for the workers
        fresh_key = stack.tmp / "leader-wait" / "state" / "id_ed25519"
        env = stack.leader_env("leader-wait", LEADER_WAIT_SECONDS="2", SSH_IDENTITY=str(fresh_key))
        t0 = time.monotonic()
        res = stack.run(LEADER, ["leader", SMOKE], env, timeout=60)
        took = time.monotonic() - t0
    finally:
        node.start()
    assert res.returncode == 3, res.stderr
    assert took < 20
    err = res.stderr
    assert f"{c.hosts[WORKERS[0]].name}:{PORT} answers" in err
    assert f"waiting for {node.name}:{PORT}: " in err  # the progress line
    assert f"{node.name}:{PORT} did not answer within 2 s" in err
    summary = [line for line in err.splitlines() if "unreachable host(s) after waiting 2 s:" in line]
    assert summary and node.name in summary[0] and c.hosts[WORKERS[0]].name not in summary[0]
    assert "rank(s) on" not in err  # no job started
    assert not port_open(c, LEADER)
    assert "leader key generated" in err and fresh_key.exists()
    assert (fresh_key.parent / "id_ed25519.pub").read_text().strip() in err


def test_leader_refuses_a_worker_whose_host_key_changed(stack, tmp_path):
    node = stack.workers[WORKERS[0]]
    known = tmp_path / "known_hosts"
    impostor = key_blob(stack.tmp / "keys" / "someone_else_ed25519.pub")
    known.write_text(f"[{node.name}]:{PORT} ssh-ed25519 {impostor}\n")
    env = stack.leader_env("leader-changed", hosts=[node.index], KNOWN_HOSTS=str(known))
    res = stack.run(LEADER, ["leader", SMOKE], env, timeout=60)
    assert res.returncode == 3, res.stderr
    # the launcher's pre-flight refuses it (accept-new adds keys, never replaces one), saying how to fix it
    assert f"{node.name}  failed  host key changed" in res.stderr
    assert f"ssh-keygen -R '[{node.name}]:{PORT}' -f {known}" in res.stderr
    assert "rank(s) on" not in res.stderr  # no job started
    assert known.read_text() == f"[{node.name}]:{PORT} ssh-ed25519 {impostor}\n"  # never rewritten
    assert not port_open(stack.cluster, LEADER)


def test_sigterm_to_the_leader_reaches_the_job(stack, tmp_path):
    c = stack.cluster
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = stack.leader_env("leader-term")
    leader = c.popen_on(
        LEADER,
        [ENTRYPOINT, "leader", "--grace", "3", RANK, "--pid-dir", str(pid_dir)],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: len(read_pids(str(pid_dir))) == 8 or leader.poll() is not None, timeout=90)
        assert leader.poll() is None, leader.communicate()[1][-3000:]
        pids = read_pids(str(pid_dir))
        leader.send_signal(signal.SIGTERM)
        _, err = leader.communicate(timeout=60)
        assert leader.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert "the launcher received SIGTERM" in err
        assert all_gone(pids, timeout=20), [p for p in pids if alive(p)]
        assert not port_open(c, LEADER)
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait(timeout=10)


def test_entrypoint_needs_a_role():
    r = subprocess.run(
        [ENTRYPOINT],
        capture_output=True,
        text=True,
        timeout=10,
        env={k: v for k, v in os.environ.items() if k != "ROLE"},
    )
    assert r.returncode == 2 and "no role" in r.stderr
    r = subprocess.run(
        [ENTRYPOINT, "wroker"],
        capture_output=True,
        text=True,
        timeout=10,
        env={k: v for k, v in os.environ.items() if k != "ROLE"},
    )
    assert r.returncode == 2 and "unknown role 'wroker'" in r.stderr
