"""docker/Dockerfile built and run: the image (on scripts/docker-standin-base.sh's stand-in for Habana's
base, so no Gaudi stack: the ranks are plain Python) starts `worker` and `leader` containers on a Docker
network of this module's own (10.231.0.0/24, internal: nothing outside is reachable, and unknown names are
never sent to a DNS server). The leader waits for a late worker, runs a 2-rank job over two workers with
mpirun, reports a rank's failure by container name, and stops on a changed worker host key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid

import pytest

from tests.docker.conftest import ROOT, docker
from tests.helpers import wait_for

pytestmark = pytest.mark.docker

# tests/cluster's namespace hosts use 10.213-10.219, tests/slurm's 10.215
SUBNET = "10.231.0.0/24"
PORT = 3022
STATE = "/var/lib/gaudi-launch/ssh"  # the image's state volume: host keys, the leader's known_hosts
RANK = """\
import os, socket, sys
rank = os.environ["RANK"]
print(f"rank {rank} of {os.environ['WORLD_SIZE']} on {socket.gethostname()}", flush=True)
sys.exit(7 if rank == os.environ.get("FAIL_RANK") else 0)
"""


class Stack:
    """This module's network, containers and volumes: each labelled with its prefix, all removed after."""

    def __init__(self, image, tmp):
        self.image, self.tmp = image, tmp
        self.prefix = f"gld{uuid.uuid4().hex[:6]}"
        self.label = f"gaudi-launch-test={self.prefix}"
        self.net = f"{self.prefix}-net"
        self.keys = tmp / "keys"
        self.keys.mkdir()
        for k in ("leader", "other"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", k, "-f", str(self.keys / k)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        self.leader_pub = (self.keys / "leader.pub").read_text().strip()
        self.job = tmp / "job"
        self.job.mkdir()
        (self.job / "rank.py").write_text(RANK)
        docker("network", "create", "--internal", "--subnet", SUBNET, "--label", self.label, self.net, check=True)

    def name(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def volume(self, role: str) -> str:
        v = f"{self.prefix}-{role}"
        docker("volume", "create", "--label", self.label, v, check=True)
        return v

    def run_args(self, name, state=None, detach=False):
        """`docker run` options of a container on this network. Docker's DNS answers for the containers and
        forwards other names to 127.0.0.1 (nothing outside this machine), where they fail in 1 s, not 10."""
        args = ["run", "--label", self.label, "--network", self.net, "--dns", "127.0.0.1"]
        args += ["--dns-opt", "timeout:1", "--dns-opt", "attempts:1"]
        args += ["-d"] if detach else ["--rm"]
        if name:
            args += ["--name", name, "--hostname", name]
        if state:
            args += ["-v", f"{state}:{STATE}"]
        return args + ["-v", f"{self.job}:/job:ro", "-v", f"{self.keys}:/keys:ro"]

    def worker(self, role: str, state=None, **env) -> str:
        name = self.name(role)
        env.setdefault("AUTHORIZED_KEY", self.leader_pub)
        args = self.run_args(name, state, detach=True)
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        docker(*args, self.image.tag, "worker", check=True)
        up = wait_for(lambda: "Server listening on 0.0.0.0 port 3022" in self.logs(name)[1], timeout=30, interval=0.2)
        assert up, f"worker {name} did not start sshd:\n{self.logs(name)[1][-3000:]}"
        return name

    def logs(self, name):
        r = docker("logs", name)
        return r.stdout, r.stderr

    def leader_args(self, hosts, state, wait=30):
        hostfile = self.tmp / f"hostfile-{'-'.join(hosts)}"
        hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts))
        return ["-v", f"{hostfile}:/etc/gaudi-launch/hostfile:ro", "-v", f"{state}:{STATE}"] + [
            "-e",
            "SSH_IDENTITY=/keys/leader",
            "-e",
            f"LEADER_WAIT_SECONDS={wait}",
        ]

    def leader(self, hosts, state, *argv, wait=30, role="leader") -> subprocess.CompletedProcess:
        args = self.run_args(None) + self.leader_args(hosts, state, wait)
        return docker(*args, self.image.tag, role, *argv, timeout=180)

    def tool(self, entrypoint, *argv) -> subprocess.CompletedProcess:
        """A throwaway container of the image on this network running `entrypoint argv`."""
        return docker(*self.run_args(None), "--entrypoint", entrypoint, self.image.tag, *argv, timeout=60)

    def ssh(self, host, key, *command):
        opts = ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no"]
        opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10"]
        return self.tool("ssh", "-p", str(PORT), "-i", f"/keys/{key}", *opts, f"root@{host}", *command)

    def host_key(self, host) -> str:
        r = self.tool("ssh-keyscan", "-p", str(PORT), "-t", "ed25519", host)
        keys = [line.split()[2] for line in r.stdout.splitlines() if line.startswith(f"[{host}]:{PORT} ssh-ed25519 ")]
        assert len(keys) == 1, r.stdout + r.stderr
        return keys[0]

    def remove(self, *names):
        if names:
            docker("rm", "--force", "--volumes", *names, timeout=120)

    def leftovers(self):
        left = docker("ps", "-aq", "--filter", f"label={self.label}").stdout.split()
        left += docker("volume", "ls", "-q", "--filter", f"label={self.label}").stdout.split()
        return left + docker("network", "ls", "-q", "--filter", f"label={self.label}").stdout.split()

    def down(self):
        self.remove(*docker("ps", "-aq", "--filter", f"label={self.label}").stdout.split())
        for v in docker("volume", "ls", "-q", "--filter", f"label={self.label}").stdout.split():
            docker("volume", "rm", v)
        docker("network", "rm", self.net)


def volumes():
    return set(docker("volume", "ls", "-q", check=True).stdout.split())


@pytest.fixture(scope="module")
def stack(image, tmp_path_factory):
    before = volumes()  # the image's VOLUME gives every container an anonymous one: none may stay
    s = Stack(image, tmp_path_factory.mktemp("docker"))
    try:
        yield s
    finally:
        s.down()
    assert not s.leftovers(), f"left by the Docker tests: {s.leftovers()}"
    assert volumes() <= before, f"volumes left: {volumes() - before}"


def test_image_builds_on_the_stand_in_base(image):
    base = json.loads(docker("image", "inspect", image.base, check=True).stdout)[0]
    info = json.loads(docker("image", "inspect", image.tag, check=True).stdout)[0]
    layers = info["RootFS"]["Layers"]
    assert layers[: len(base["RootFS"]["Layers"])] == base["RootFS"]["Layers"], "not built FROM the stand-in"
    cfg = info["Config"]
    assert cfg["Entrypoint"] == ["/usr/local/bin/gaudi-launch-entrypoint"] and cfg["Cmd"] == ["worker"]
    assert f"{PORT}/tcp" in cfg["ExposedPorts"] and STATE in cfg["Volumes"]
    # no SSH key of any kind in the image; gaudi-launch installed for the base's python3
    r = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "bash", image.tag, "-c",
        "ls /etc/ssh/ssh_host_* /root/.ssh/id_* /root/.ssh/authorized_keys 2>/dev/null | wc -l;"
        "python3 -c 'import gaudi_launch; print(gaudi_launch.__file__)'",
        check=True,
    )  # fmt: skip
    count, where = r.stdout.split()
    assert count == "0" and where.startswith("/usr/local/lib/python3"), r.stdout
    print(f"stand-in base {image.base_s:.0f} s, image build {image.build_s:.0f} s, {info['Size'] / 1e6:.0f} MB")


def test_non_root_user_with_uid_1000_is_created_on_an_ubuntu_24_04_base(image):
    """The Dockerfile's user RUN, run as docker would (bash -o pipefail -c, the ARGs in the environment)
    in the stand-in base, which holds Ubuntu 24.04's own user "ubuntu" at uid 1000 like Habana's
    ubuntu24.04 images: USER=gaudi USER_UID=1000 must end with gaudi at uid 1000, not with `useradd: UID
    1000 is not unique`. (A full image build as non-root would rebuild every layer: a minute more.)"""
    from dockerfile_parse import DockerfileParser

    parsed = DockerfileParser(path=os.path.join(ROOT, "docker", "Dockerfile"), env_replace=False)
    (run,) = [i["value"] for i in parsed.structure if i["instruction"] == "RUN" and "useradd" in i["value"]]
    assert "ubuntu24.04" in image.base, image.base  # the Dockerfile's default OS, which the stand-in names
    script = f"getent passwd 1000 | cut -d: -f1; {run}; id -u gaudi; getent passwd 1000 | cut -d: -f1"
    r = docker(
        "run", "--rm", "--network", "none", "-e", "USER=gaudi", "-e", "USER_UID=1000", "--entrypoint", "bash",
        image.base, "-o", "pipefail", "-c", script, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, f"the user RUN failed on the ubuntu24.04 stand-in:\n{r.stdout}{r.stderr}"
    assert r.stdout.split() == ["ubuntu", "1000", "gaudi"], r.stdout


def test_worker_without_a_key_refuses_to_start(stack):
    t0 = time.monotonic()
    r = docker(*stack.run_args(stack.name("keyless")), stack.image.tag, "worker", timeout=30)
    assert r.returncode == 2, r.stderr
    assert "no authorized key" in r.stderr and "starting sshd" not in r.stderr
    assert time.monotonic() - t0 < 30


def test_worker_serves_ssh_on_3022_to_the_given_key_only(stack):
    w = stack.worker("keyed")
    r = stack.ssh(w, "leader", "hostname")
    assert r.returncode == 0 and r.stdout.strip() == w, r.stderr
    r = stack.ssh(w, "other", "hostname")
    assert r.returncode == 255 and "Permission denied (publickey)" in r.stderr, r.stderr
    stack.remove(w)


def test_host_keys_differ_per_container_and_survive_a_restart_with_the_state_volume(stack):
    va = stack.volume("a-state")
    a, b = stack.worker("a", state=va), stack.worker("b")
    key_a, key_b = stack.host_key(a), stack.host_key(b)
    assert key_a != key_b
    assert "host key generated" in stack.logs(a)[1]

    stack.remove(a)  # a new container on the same volume: the same host key
    a = stack.worker("a", state=va)
    assert stack.host_key(a) == key_a
    assert "host key kept" in stack.logs(a)[1] and "host key generated" not in stack.logs(a)[1]
    # (and without that volume a new one)
    stack.remove(a)
    a = stack.worker("a")
    assert stack.host_key(a) not in (key_a, key_b)
    stack.remove(a, b)


def test_leader_waits_for_a_late_worker_then_runs_a_job_on_both(stack):
    a = stack.worker("early")
    b = stack.name("late")
    state = stack.volume("leader-state")
    leader = stack.name("leader")
    args = stack.run_args(leader, detach=True) + stack.leader_args([a, b], state, wait=60)
    docker(*args, stack.image.tag, "leader", "/job/rank.py", check=True)
    try:
        waiting = f"waiting for {b}:{PORT}: name not resolved"
        assert wait_for(lambda: waiting in stack.logs(leader)[1], timeout=60, interval=0.5), stack.logs(leader)[1]
        stack.worker("late")
        code = docker("wait", leader, timeout=120, check=True).stdout.strip()
        out, err = stack.logs(leader)
    finally:
        stack.remove(leader)
    assert code == "0", err[-4000:]
    assert re.search(rf"{b}:{PORT} answers \(after [1-9]\d* s\)", err), err[-4000:]
    ranks = sorted(line.split("] ", 1)[1] for line in out.splitlines() if " of 2 on " in line)
    assert ranks == [f"rank 0 of 2 on {a}", f"rank 1 of 2 on {b}"], out[-4000:]
    # the leader recorded both workers' host keys in its state volume (accept-new)
    known = docker(*stack.run_args(None), "-v", f"{state}:/s:ro", "--entrypoint", "cat", stack.image.tag,
                   "/s/known_hosts", check=True).stdout  # fmt: skip
    for w in (a, b):
        assert stack.host_key(w) in {line.split()[2] for line in known.splitlines() if line.startswith(f"[{w}]:")}
    stack.remove(a, b)


def test_a_rank_failing_on_a_worker_is_the_leaders_exit_code_naming_that_container(stack):
    a, b = stack.worker("ok"), stack.worker("failing")
    r = stack.leader([a, b], stack.volume("leader-fail"), "-x", "FAIL_RANK=1", "/job/rank.py")
    assert r.returncode == 7, r.stderr[-4000:]
    first = [line for line in r.stderr.splitlines() if line.startswith("first failure: ")]
    assert len(first) == 1 and first[0].startswith(f"first failure: rank 1 on {b} "), r.stderr[-4000:]
    assert "exit code 7" in first[0] and "exit code: 7" in r.stderr
    stack.remove(a, b)


def test_a_changed_worker_host_key_stops_the_leader(stack):
    state = stack.volume("leader-strict")
    a = stack.worker("rekeyed")
    r = stack.leader([a], state, role="check")  # the pre-flight alone records its host key
    assert r.returncode == 0, r.stderr[-3000:]
    stack.remove(a)
    a = stack.worker("rekeyed")  # same name, no state volume: a new host key
    r = stack.leader([a], state, "/job/rank.py")
    assert r.returncode == 3, r.stderr[-3000:]
    assert f"{a}  failed  host key changed" in r.stderr, r.stderr[-3000:]
    assert "rank(s) on" not in r.stderr and "of 1 on" not in r.stdout  # nothing started
    stack.remove(a)
