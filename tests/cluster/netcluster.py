"""A real multi-host cluster on one machine, for tests of the multi-node launcher.

Each "host" is a network namespace with its own address, hostname, /etc/hosts and sshd, reached over a
bridge in the root namespace. Needs root and: ip (iproute2), unshare/nsenter (util-linux), /usr/sbin/sshd,
ssh, ssh-keygen (scripts/install-system-deps.sh installs them). Plain Python, standard library only.

Layout for prefix "gl", octet 213 and n hosts:
  bridge gl-br0 10.213.0.1/24 (root namespace; also the "gl-ctl" name in the hosts file)
  host i: netns gl-nI, veth gl-hI (root side, on the bridge) / eth0 (inside) 10.213.0.(10+I)/24,
          hostname gl-nI, sshd on 10.213.0.(10+I):22
Up to 200 hosts (.10-.209 of the /24). 64 hosts (tests/cluster/test_cluster_scale.py, scripts/bench/bench_scale.py)
come up in about 2 s and cost about 1.5 MiB of memory a host idle (proportional set size of its sshd and
anchor, memory_kib()); the kernel's defaults hold them (bridge ports, neighbour tables: gc_thresh3 1024).
Only 10.<octet>.0.0/24 is ever addressed; nothing is sent anywhere else (resolv.conf points at 127.0.0.1).
Each test cluster has a prefix and octet of its own (tests/slurm's is gls/215); a test checks it.

Per host, an "anchor" process (`sleep infinity`) holds the host's mount and UTS namespaces
(`ip netns exec NS unshare --uts sh -c "mount --bind HOSTS /etc/hosts && mount --bind RESOLV
/etc/resolv.conf && hostname NAME && exec sleep infinity"`), and sshd runs in exactly those namespaces
(`nsenter -t ANCHOR -n -u -m -- /usr/sbin/sshd -D -e -f CONF`), so stopping and restarting sshd keeps the
host, and run_on() works while its sshd is down.

CLI (also scripts/testcluster.sh):
  python tests/cluster/netcluster.py up [N] [DIR]     build and leave running (DIR default /tmp/gaudi-launch-cluster)
  python tests/cluster/netcluster.py down [DIR]
  python tests/cluster/netcluster.py status [DIR]
"""

from __future__ import annotations

import argparse
import atexit
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

SSHD = "/usr/sbin/sshd"
DEFAULT_DIR = "/tmp/gaudi-launch-cluster"
LOCK_DIR = "/run/gaudi-launch-netcluster"
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "ssh", "ssh-keygen", "sleep", "mount", "hostname")

_PROBE = r"""
import socket, sys, time
addr, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect((addr, 22))
        s.close()
        sys.exit(0)
    except OSError:
        s.close()
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.02)
"""


class ClusterError(RuntimeError):
    pass


def missing_requirements() -> list[str]:
    """What keeps a NetCluster from being built here (empty when nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, bind mounts)")
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD + " (openssh-server)")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


# ---------------------------------------------------------------- process helpers


def _proc_start(pid: int) -> Optional[int]:
    """Start time of a process (clock ticks since boot), None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(pid: int, start: Optional[int] = None) -> bool:
    now = _proc_start(pid)
    return now is not None and (start is None or now == start)


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _terminate(popens: Sequence[subprocess.Popen], pids: dict[int, Optional[int]], grace: float = 1.0) -> None:
    """TERM our Popens and the given PIDs (pid -> start time, checked so a reused PID is never hit),
    wait up to `grace` seconds, then KILL the rest. Popens are waited for (no zombies)."""
    popens = [p for p in popens if p is not None and p.poll() is None]
    own = {p.pid for p in popens}
    others = {pid: st for pid, st in pids.items() if pid not in own and pid != os.getpid() and _alive(pid, st)}
    for p in popens:
        try:
            p.terminate()
        except ProcessLookupError:
            pass
    _signal_all(others, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        others = {pid: st for pid, st in others.items() if _alive(pid, st)}
        if not others and all(p.poll() is not None for p in popens):
            break
        time.sleep(0.01)
    for p in popens:
        if p.poll() is None:
            p.kill()
    _signal_all([pid for pid, st in others.items() if _alive(pid, st)], signal.SIGKILL)
    for p in popens:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 5
    while any(_alive(pid, st) for pid, st in others.items()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _run(argv: Sequence[str], check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"{shlex.join(argv)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


def _ip_batch(lines: list[str], netns: Optional[str] = None) -> None:
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    _run(argv, input="\n".join(lines) + "\n")


def _netns_names() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_pids(ns: str) -> dict[int, Optional[int]]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    pids = {}
    for tok in out.split():
        if tok.isdigit():
            pids[int(tok)] = _proc_start(int(tok))
    return pids


def _smaps_rollup(pid: int) -> dict[str, int]:
    """A process's memory totals (kB) from /proc/PID/smaps_rollup; empty when gone or unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.readlines()
    except OSError:
        return {}
    out = {}
    for line in lines[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def _write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ---------------------------------------------------------------- locks


class _Lock:
    """flock on /run/gaudi-launch-netcluster/<key>.lock, so two clusters never share a prefix or subnet.

    Held by the process that called up() (released by the kernel if it dies: its leftovers are then
    stale and the next up() removes them), or by a `sleep infinity` holder after detach() (CLI `up`)."""

    def __init__(self, key: str):
        os.makedirs(LOCK_DIR, exist_ok=True)
        self.path = os.path.join(LOCK_DIR, key + ".lock")
        self.fd: Optional[int] = None

    def holder(self) -> dict:
        try:
            with open(self.path) as f:
                return json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, info: dict, timeout: float) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            h = self.holder()
            if h.get("detached"):
                os.close(fd)
                raise ClusterError(
                    f"{self.path} is held by a cluster left running with `testcluster.sh up` in "
                    f"{h.get('workdir')}; take it down with: scripts/testcluster.sh down {h.get('workdir')}"
                )
            if time.monotonic() > deadline:
                os.close(fd)
                raise ClusterError(
                    f"{self.path} is still held by pid {h.get('pid')} (cluster in "
                    f"{h.get('workdir')}) after {timeout:.0f} s"
                )
            if not announced:
                print(
                    f"netcluster: waiting for {self.path} (held by pid {h.get('pid')}, cluster in {h.get('workdir')})",
                    file=sys.stderr,
                )
                announced = True
            time.sleep(0.2)
        self.fd = fd
        self.write(info)

    def write(self, info: dict) -> None:
        assert self.fd is not None
        data = json.dumps(info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def is_held_elsewhere(self) -> bool:
        if self.fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)


# ---------------------------------------------------------------- the cluster


@dataclass
class ClusterHost:
    index: int
    name: str  # "gl-n0" (also its hostname)
    addr: str  # "10.213.0.10"
    netns: str  # "gl-n0"
    sshd: Optional[subprocess.Popen] = None  # None after stop_sshd(), or when loaded from a state dir
    anchor: Optional[subprocess.Popen] = None  # `sleep infinity` holding the host's mount+UTS namespaces
    veth: str = ""  # root-side veth name "gl-h0"
    sshd_config: str = ""
    host_key: str = ""
    sshd_log: str = ""
    # PIDs with start times; used when the Popens live in another process (CLI down)
    sshd_pid: Optional[int] = None
    sshd_start: Optional[int] = None
    anchor_pid: Optional[int] = None
    anchor_start: Optional[int] = None


class NetCluster:
    def __init__(
        self,
        n: int,
        workdir: str,
        prefix: str = "gl",
        subnet_octet: int = 213,
        lock_timeout: Optional[float] = None,
        sshd_log_level: str = "ERROR",
    ):
        if not 1 <= n <= 200:
            raise ValueError("n must be 1..200")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise ValueError("prefix: 1-8 lowercase letters/digits, starting with a letter")
        if not 1 <= subnet_octet <= 254:
            raise ValueError("subnet_octet must be 1..254")
        self.n = n
        self.sshd_log_level = sshd_log_level  # INFO: one "Accepted publickey" line per handshake
        self.prefix = prefix
        self.octet = subnet_octet
        self.workdir = os.path.abspath(workdir)
        self.subnet = f"10.{subnet_octet}.0.0/24"
        self.bridge = f"{prefix}-br0"
        self.bridge_addr = f"10.{subnet_octet}.0.1"
        self.key = os.path.join(self.workdir, "id_ed25519")
        self.pubkey = self.key + ".pub"
        self.authorized_keys = os.path.join(self.workdir, "authorized_keys")
        self.ssh_config = os.path.join(self.workdir, "ssh_config")
        self.known_hosts = os.path.join(self.workdir, "known_hosts")
        self.bin_dir = os.path.join(self.workdir, "bin")
        self.hosts_file = os.path.join(self.workdir, "hosts")
        self.resolv_conf = os.path.join(self.workdir, "resolv.conf")
        self.state_file = os.path.join(self.workdir, "state.json")
        self.hosts: list[ClusterHost] = []
        for i in range(n):
            hdir = os.path.join(self.workdir, f"n{i}")
            self.hosts.append(
                ClusterHost(
                    index=i,
                    name=f"{prefix}-n{i}",
                    addr=f"10.{subnet_octet}.0.{10 + i}",
                    netns=f"{prefix}-n{i}",
                    veth=f"{prefix}-h{i}",
                    sshd_config=os.path.join(hdir, "sshd_config"),
                    host_key=os.path.join(self.workdir, "hostkeys", f"ssh_host_ed25519_key.{prefix}-n{i}"),
                    sshd_log=os.path.join(hdir, "sshd.log"),
                )
            )
        self.lock_timeout = float(
            os.environ.get("GAUDI_LAUNCH_CLUSTER_LOCK_TIMEOUT", "600") if lock_timeout is None else lock_timeout
        )
        self._locks = [_Lock(f"prefix-{prefix}"), _Lock(f"net-10.{subnet_octet}")]
        self._holder_pid: Optional[int] = None
        self._holder_start: Optional[int] = None
        self._up = False
        self._atexit = False
        self._loaded = False
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------ public API

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def __enter__(self) -> NetCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> NetCluster:
        missing = missing_requirements()
        if missing:
            raise ClusterError("cannot build a test cluster here, missing: " + ", ".join(missing))
        t0 = time.monotonic()
        os.makedirs(self.workdir, exist_ok=True)
        info = {"pid": os.getpid(), "workdir": self.workdir, "prefix": self.prefix, "octet": self.octet}
        locked = []
        try:
            for lock in self._locks:
                lock.acquire(info, self.lock_timeout)
                locked.append(lock)
        except BaseException:
            for lock in locked:
                lock.release()
            raise
        self._atexit = True
        atexit.register(self.down)
        try:
            self._remove_stale()
            self._check_subnet_free()
            self._write_files()
            self._build_network()
            self._start_anchors()
            for h in self.hosts:
                self._spawn_sshd(h)
            self._wait_ready(self.hosts)
            self._up = True
            self._save_state()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - t0
        return self

    def down(self) -> None:
        """Tear down everything this cluster made (even half-built). Idempotent; touches only our names."""
        t0 = time.monotonic()
        if self._atexit:
            atexit.unregister(self.down)
            self._atexit = False
        owned = any(lock.fd is not None for lock in self._locks) or self._up or self._loaded
        if not owned:
            return  # never built (or already down): nothing of ours exists, touch nothing
        try:
            self._teardown(self.hosts)
        finally:
            if self._holder_pid is not None:
                _terminate([], {self._holder_pid: self._holder_start})
                self._holder_pid = None
            for lock in self._locks:
                lock.release()
            self._up = False
            self._loaded = False
            try:
                os.unlink(self.state_file)
            except FileNotFoundError:
                pass
        self.timings["down"] = time.monotonic() - t0

    def hostfile(self, slots: int = 2, hosts=None) -> str:
        """Write a DeepSpeed-style hostfile ("gl-n0 slots=2" lines) in workdir and return its path.
        hosts: indices, names or ClusterHosts (default: all)."""
        chosen = self.hosts if hosts is None else [self._host(h) for h in hosts]
        text = "".join(f"{h.name} slots={slots}\n" for h in chosen)
        path = os.path.join(self.workdir, f"hostfile.{'_'.join(str(h.index) for h in chosen)}.s{slots}")
        _write(path, text)
        return path

    def env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        """Environment for launchers: `base` (default os.environ) with bin_dir first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.bin_dir + os.pathsep + env.get("PATH", os.defpath)
        return env

    def ssh_argv(self, target, *command: str, options: Sequence[str] = ()) -> list[str]:
        """["/usr/bin/ssh", "-F", ssh_config, *options, name, *command]."""
        name = self._host(target).name
        return ["/usr/bin/ssh", "-F", self.ssh_config, *options, name, *command]

    def nsenter_argv(self, i, argv: Sequence[str], cwd: Optional[str] = None) -> list[str]:
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a string")
        h = self._host(i)
        pid = self._anchor_pid(h)
        wd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        return ["nsenter", "-t", str(pid), "-n", "-u", "-m", f"--wd={wd}", "--", *argv]

    def run_on(self, i, argv: Sequence[str], **popen_kwargs) -> subprocess.CompletedProcess:
        """Run argv "on host i" as an ssh session there sees it (its network, hostname, /etc/hosts):
        nsenter -t <host pid> -n -u -m --wd=<cwd or os.getcwd()> -- argv. Keyword arguments go to subprocess.run."""
        cwd = popen_kwargs.pop("cwd", None)
        return subprocess.run(self.nsenter_argv(i, argv, cwd), **popen_kwargs)

    def popen_on(self, i, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        cwd = popen_kwargs.pop("cwd", None)
        return subprocess.Popen(self.nsenter_argv(i, argv, cwd), **popen_kwargs)

    def login_argv(self, argv: Sequence[str]) -> list[str]:
        """Run argv in the root namespace as a login node outside the hostfile: on the bridge's
        network, with the cluster's hosts file and resolv.conf bound over this mount namespace's own."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a string")
        script = 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "login",
            self.hosts_file,
            self.resolv_conf,
            *argv,
        ]

    def stop_sshd(self, i) -> None:
        """Stop host i's sshd (the listener; running sessions stay). The host itself stays up."""
        h = self._host(i)
        pids = {h.sshd_pid: h.sshd_start} if h.sshd is None and h.sshd_pid else {}
        _terminate([h.sshd] if h.sshd else [], pids)
        h.sshd, h.sshd_pid, h.sshd_start = None, None, None
        self._save_state()

    def start_sshd(self, i) -> None:
        """Start host i's sshd again (same config and host key) and wait until it accepts connections."""
        h = self._host(i)
        if h.sshd is not None and h.sshd.poll() is None:
            return
        self._spawn_sshd(h)
        self._wait_ready([h])
        self._save_state()

    def cut_link(self, i) -> None:
        """Make host i vanish from the network: its veth goes down on both ends (peers see timeouts)."""
        h = self._host(i)
        _run(["ip", "link", "set", h.veth, "down"])
        _run(["ip", "-n", h.netns, "link", "set", "eth0", "down"])

    def restore_link(self, i) -> None:
        h = self._host(i)
        _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
        _run(["ip", "link", "set", h.veth, "up"])
        self._wait_ready([h])

    # ------------------------------------------------------------ CLI support

    def detach(self) -> None:
        """Leave the cluster running after this process exits (CLI `up`): the locks pass to a
        `sleep infinity` holder, and down() from another process (load(workdir).down()) ends it."""
        fds = [lock.fd for lock in self._locks if lock.fd is not None]
        holder = subprocess.Popen(
            ["sleep", "infinity"],
            pass_fds=fds,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._holder_pid, self._holder_start = holder.pid, _proc_start(holder.pid)
        info = {
            "pid": holder.pid,
            "workdir": self.workdir,
            "prefix": self.prefix,
            "octet": self.octet,
            "detached": True,
        }
        for lock in self._locks:
            lock.write(info)
            os.close(lock.fd)  # the holder keeps the lock (same open file description)
            lock.fd = None
        for h in self.hosts:
            h.sshd_pid = h.sshd.pid if h.sshd else h.sshd_pid
            h.anchor_pid = h.anchor.pid if h.anchor else h.anchor_pid
        self._save_state()
        if self._atexit:
            atexit.unregister(self.down)
            self._atexit = False
        self._up = False
        self._loaded = True  # down() from this process still works

    @classmethod
    def load(cls, workdir: str) -> NetCluster:
        """A handle on a cluster left running by another process (from <workdir>/state.json)."""
        with open(os.path.join(workdir, "state.json")) as f:
            st = json.load(f)
        c = cls(st["n"], st["workdir"], st["prefix"], st["octet"])
        c._holder_pid, c._holder_start = st.get("holder_pid"), st.get("holder_start")
        for h, hs in zip(c.hosts, st["hosts"]):
            h.sshd_pid, h.sshd_start = hs.get("sshd_pid"), hs.get("sshd_start")
            h.anchor_pid, h.anchor_start = hs.get("anchor_pid"), hs.get("anchor_start")
        c._loaded = True
        return c

    def memory_kib(self) -> dict[str, int]:
        """What the hosts hold in memory now, KiB: the proportional set size (shared pages split among
        their users, so sums add up) and the resident size of every process in the hosts' network
        namespaces (anchor, sshd, and whatever sessions run there), summed over all hosts."""
        pss = rss = procs = 0
        for h in self.hosts:
            for pid in _netns_pids(h.netns):
                fields = _smaps_rollup(pid)
                if fields:
                    procs += 1
                    pss += fields.get("Pss", 0)
                    rss += fields.get("Rss", 0)
        return {"pss": pss, "rss": rss, "processes": procs, "hosts": self.n}

    def status(self) -> list[dict]:
        netns = set(_netns_names())
        out = []
        for h in self.hosts:
            pid = h.sshd.pid if h.sshd else h.sshd_pid
            start = _proc_start(h.sshd.pid) if h.sshd else h.sshd_start
            out.append(
                {
                    "name": h.name,
                    "addr": h.addr,
                    "netns": h.netns in netns,
                    "sshd_pid": pid,
                    "sshd_alive": bool(pid) and _alive(pid, start),
                }
            )
        return out

    # ------------------------------------------------------------ internals

    def _host(self, i) -> ClusterHost:
        if isinstance(i, ClusterHost):
            return i
        if isinstance(i, str):
            for h in self.hosts:
                if i in (h.name, h.addr):
                    return h
            raise KeyError(i)
        return self.hosts[i]

    def _anchor_pid(self, h: ClusterHost) -> int:
        if h.anchor is not None:
            return h.anchor.pid
        if h.anchor_pid:
            return h.anchor_pid
        raise ClusterError(f"{h.name} is not up")

    def _our_netns(self, names: Iterable[str]) -> list[str]:
        pat = re.compile(re.escape(self.prefix) + r"-n\d+")
        return [n for n in names if pat.fullmatch(n)]

    def _our_links(self, names: Iterable[str]) -> list[str]:
        pat = re.compile(re.escape(self.prefix) + r"-(h\d+|br0)")
        return [n for n in names if pat.fullmatch(n)]

    def _remove_stale(self) -> None:
        """Leftovers of a crashed run with our prefix (we hold the prefix lock, so nobody uses them)."""
        netns = self._our_netns(_netns_names())
        links = self._our_links(_link_names())
        if netns or links:
            print(f"netcluster: removing stale cluster {self.prefix}: {' '.join(netns + links)}", file=sys.stderr)
            self._remove(netns, links, {})

    def _check_subnet_free(self) -> None:
        out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[3].startswith(f"10.{self.octet}.0."):
                raise ClusterError(
                    f"{self.subnet} is already in use on {parts[1]} ({parts[3]}); pick another subnet_octet"
                )

    def _write_files(self) -> None:
        for d in [self.bin_dir, os.path.join(self.workdir, "hostkeys")] + [
            os.path.dirname(h.sshd_config) for h in self.hosts
        ]:
            os.makedirs(d, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        keygens = []
        for path, comment in [(self.key, f"netcluster-{self.prefix}-client")] + [
            (h.host_key, h.name) for h in self.hosts
        ]:
            if not (os.path.exists(path) and os.path.exists(path + ".pub")):
                for p in (path, path + ".pub"):
                    if os.path.exists(p):
                        os.unlink(p)
                keygens.append(
                    subprocess.Popen(
                        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                    )
                )
        for p in keygens:
            out = p.communicate()[0]
            if p.returncode != 0:
                raise ClusterError(f"ssh-keygen failed: {out.decode(errors='replace')}")
        with open(self.pubkey) as f:
            pub = f.read().strip()
        _write(self.authorized_keys, pub + "\n")

        lines = [
            "127.0.0.1 localhost",
            "::1 localhost ip6-localhost ip6-loopback",
            f"{self.bridge_addr} {self.prefix}-ctl",
        ]
        for h in self.hosts:
            lines += [f"{h.addr} {h.name}", f"::ffff:{h.addr} {h.name}"]
        _write(self.hosts_file, "\n".join(lines) + "\n")
        _write(self.resolv_conf, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

        known = []
        for h in self.hosts:
            with open(h.host_key + ".pub") as f:
                kt, kb = f.read().split()[:2]
            known.append(f"{h.name},{h.addr} {kt} {kb}")
        _write(self.known_hosts, "\n".join(known) + "\n")

        cfg = [
            f"Host {self.prefix}-n* 10.{self.octet}.0.*",
            "    User root",
            f"    IdentityFile {self.key}",
            "    IdentitiesOnly yes",
            "    StrictHostKeyChecking accept-new",
            f"    UserKnownHostsFile {self.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    LogLevel ERROR",
            "",
        ]
        # Names map to addresses in the client config too, so ssh works from the root namespace
        # (whose /etc/hosts does not know the cluster) as well as inside the hosts.
        for h in self.hosts:
            cfg += [f"Host {h.name}", f"    HostName {h.addr}", ""]
        _write(self.ssh_config, "\n".join(cfg))
        _write(
            os.path.join(self.bin_dir, "ssh"),
            f'#!/bin/sh\nexec /usr/bin/ssh -F {shlex.quote(self.ssh_config)} "$@"\n',
            0o755,
        )

        for h in self.hosts:
            hdir = os.path.dirname(h.sshd_config)
            _write(
                h.sshd_config,
                "\n".join(
                    [
                        f"ListenAddress {h.addr}",
                        "Port 22",
                        f"HostKey {h.host_key}",
                        f"PidFile {os.path.join(hdir, 'sshd.pid')}",
                        f"AuthorizedKeysFile {self.authorized_keys}",
                        "PermitRootLogin prohibit-password",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        "UseDNS no",
                        "MaxStartups 100:30:200",
                        "MaxSessions 100",
                        "AcceptEnv *",
                        "PermitUserEnvironment no",
                        "PrintMotd no",
                        "PrintLastLog no",
                        "X11Forwarding no",
                        f"LogLevel {self.sshd_log_level}",
                        "Subsystem sftp internal-sftp",
                    ]
                )
                + "\n",
                0o600,
            )

    def _build_network(self) -> None:
        root = [
            f"link add {self.bridge} type bridge",
            f"addr add {self.bridge_addr}/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for h in self.hosts:
            root += [
                f"netns add {h.netns}",
                f"link add {h.veth} type veth peer name eth0 netns {h.netns}",
                f"link set {h.veth} master {self.bridge}",
                f"link set {h.veth} up",
            ]
        _ip_batch(root)
        for h in self.hosts:
            _ip_batch(["link set lo up", f"addr add {h.addr}/24 dev eth0", "link set eth0 up"], netns=h.netns)

    def _start_anchors(self) -> None:
        for h in self.hosts:
            script = (
                f"mount --bind {shlex.quote(self.hosts_file)} /etc/hosts"
                f" && mount --bind {shlex.quote(self.resolv_conf)} /etc/resolv.conf"
                f" && hostname {shlex.quote(h.name)}"
                f" && echo ready && exec sleep infinity >/dev/null"
            )
            h.anchor = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        for h in self.hosts:
            assert h.anchor is not None and h.anchor.stdout is not None
            line = h.anchor.stdout.readline()
            h.anchor.stdout.close()
            if line.strip() != b"ready":
                err = h.anchor.stderr.read().decode(errors="replace") if h.anchor.stderr else ""
                raise ClusterError(f"{h.name}: could not set up its namespaces: {err.strip()}")
            h.anchor.stderr.close()
            h.anchor_pid, h.anchor_start = h.anchor.pid, _proc_start(h.anchor.pid)

    def _spawn_sshd(self, h: ClusterHost) -> None:
        with open(h.sshd_log, "ab") as log:
            h.sshd = subprocess.Popen(
                [
                    "nsenter",
                    "-t",
                    str(self._anchor_pid(h)),
                    "-n",
                    "-u",
                    "-m",
                    "--",
                    SSHD,
                    "-D",
                    "-e",
                    "-f",
                    h.sshd_config,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd="/",
            )
        h.sshd_pid, h.sshd_start = h.sshd.pid, _proc_start(h.sshd.pid)

    def _wait_ready(self, hosts: list[ClusterHost], timeout: float = 10.0) -> None:
        """TCP-connect to addr:22 from inside each host, every 20 ms, up to `timeout` s."""
        probes = {
            h.index: subprocess.Popen(
                [
                    "nsenter",
                    "-t",
                    str(self._anchor_pid(h)),
                    "-n",
                    "--",
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _PROBE,
                    h.addr,
                    str(timeout),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for h in hosts
        }
        try:
            while probes:
                for h in hosts:
                    p = probes.get(h.index)
                    if p is None:
                        continue
                    if h.sshd is not None and h.sshd.poll() is not None:
                        raise ClusterError(f"{h.name}: sshd exited ({h.sshd.returncode}): {self._log_tail(h)}")
                    rc = p.poll()
                    if rc is None:
                        continue
                    del probes[h.index]
                    if rc != 0:
                        raise ClusterError(
                            f"{h.name}: sshd not reachable on {h.addr}:22 after {timeout} s: {self._log_tail(h)}"
                        )
                time.sleep(0.005)
        finally:
            for p in probes.values():
                p.kill()
                p.wait()

    def _log_tail(self, h: ClusterHost) -> str:
        try:
            with open(h.sshd_log, errors="replace") as f:
                return f.read()[-2000:].strip() or "(empty log)"
        except OSError:
            return "(no log)"

    def _teardown(self, hosts: list[ClusterHost]) -> None:
        popens = []
        pids: dict[int, Optional[int]] = {}
        for h in hosts:
            for p, pid, st in ((h.sshd, h.sshd_pid, h.sshd_start), (h.anchor, h.anchor_pid, h.anchor_start)):
                if p is not None:
                    popens.append(p)
                elif pid:
                    pids[pid] = st
        netns = [n for n in self._our_netns(_netns_names()) if n in {h.netns for h in hosts}]
        links = [n for n in self._our_links(_link_names()) if n in {h.veth for h in hosts} | {self.bridge}]
        self._remove(netns, links, pids, popens)
        for h in hosts:
            h.sshd = h.anchor = None
            h.sshd_pid = h.sshd_start = h.anchor_pid = h.anchor_start = None

    def _remove(
        self,
        netns: list[str],
        links: list[str],
        pids: dict[int, Optional[int]],
        popens: Sequence[subprocess.Popen] = (),
    ) -> None:
        pids = dict(pids)
        for ns in netns:
            pids.update(_netns_pids(ns))
        _terminate(popens, pids)
        # veths first: `ip netns del` frees the namespace (and its eth0) asynchronously
        veths = [l for l in links if l != self.bridge]
        cmds = [f"link del {l}" for l in veths] + [f"netns del {ns}" for ns in netns]
        if self.bridge in links:
            cmds.append(f"link del {self.bridge}")
        if cmds:
            r = _run(["ip", "-force", "-batch", "-"], check=False, input="\n".join(cmds) + "\n")
            left = self._our_netns(_netns_names()) + self._our_links(_link_names())
            left = [x for x in left if x in set(netns) | set(links)]
            if left:
                raise ClusterError(f"teardown left {left}: {r.stderr.strip()}")

    def _save_state(self) -> None:
        if not os.path.isdir(self.workdir):
            return
        st = {
            "n": self.n,
            "workdir": self.workdir,
            "prefix": self.prefix,
            "octet": self.octet,
            "holder_pid": self._holder_pid,
            "holder_start": self._holder_start,
            "hosts": [],
        }
        for h in self.hosts:
            st["hosts"].append(
                {
                    "name": h.name,
                    "addr": h.addr,
                    "netns": h.netns,
                    "veth": h.veth,
                    "sshd_pid": h.sshd.pid if h.sshd else h.sshd_pid,
                    "sshd_start": _proc_start(h.sshd.pid) if h.sshd else h.sshd_start,
                    "anchor_pid": h.anchor.pid if h.anchor else h.anchor_pid,
                    "anchor_start": _proc_start(h.anchor.pid) if h.anchor else h.anchor_start,
                }
            )
        _write(self.state_file, json.dumps(st, indent=1) + "\n")


# ---------------------------------------------------------------- CLI


def _cli_up(args) -> int:
    missing = missing_requirements()
    if missing:
        print(
            "cannot build a test cluster here, missing: "
            + ", ".join(missing)
            + "\n(run scripts/install-system-deps.sh as root)",
            file=sys.stderr,
        )
        return 1
    if os.path.exists(os.path.join(args.dir, "state.json")):
        try:
            old = NetCluster.load(args.dir)
            if any(s["sshd_alive"] for s in old.status()):
                print(
                    f"a cluster is already up in {args.dir}; run: scripts/testcluster.sh down {args.dir}",
                    file=sys.stderr,
                )
                return 1
            old.down()
        except (OSError, ValueError, KeyError):
            pass
    c = NetCluster(args.n, args.dir, args.prefix, args.octet, lock_timeout=0)
    try:
        c.up()
    except ClusterError as e:
        print(f"up failed: {e}", file=sys.stderr)
        return 1
    c.detach()
    print(f"cluster up in {c.timings['up']:.2f} s: " + ", ".join(f"{h.name}={h.addr}" for h in c.hosts))
    print(f"  ssh:        ssh -F {c.ssh_config} {c.hosts[min(1, c.n - 1)].name} hostname")
    print(f"  ssh wrapper: PATH={c.bin_dir}:$PATH  (for pdsh / mpirun / deepspeed)")
    print(f"  on a host:  nsenter -t {c.hosts[0].anchor_pid} -n -u -m --wd=$PWD -- bash   ({c.hosts[0].name})")
    print(f"  down:       scripts/testcluster.sh down {c.workdir}")
    return 0


def _cli_down(args) -> int:
    if os.path.exists(os.path.join(args.dir, "state.json")):
        c = NetCluster.load(args.dir)
    else:
        c = NetCluster(1, args.dir, args.prefix, args.octet)
        if c._locks[0].is_held_elsewhere():
            print(
                f"no state in {args.dir}, and cluster '{args.prefix}' is in use by "
                f"{c._locks[0].holder()}; not touching it",
                file=sys.stderr,
            )
            return 1
        stale_ns = c._our_netns(_netns_names())
        stale_links = c._our_links(_link_names())
        if not stale_ns and not stale_links:
            print("nothing to take down")
            return 0
        c._remove(stale_ns, stale_links, {})
        print(f"removed stale {' '.join(stale_ns + stale_links)}")
        return 0
    t0 = time.monotonic()
    c.down()
    print(f"cluster {c.prefix} in {c.workdir} down in {time.monotonic() - t0:.2f} s")
    return 0


def _cli_status(args) -> int:
    if not os.path.exists(os.path.join(args.dir, "state.json")):
        print(f"no cluster state in {args.dir}")
        leftovers = [n for n in _netns_names() if re.fullmatch(re.escape(args.prefix) + r"-n\d+", n)]
        if leftovers:
            print(f"but these namespaces exist: {' '.join(leftovers)}")
        return 1
    c = NetCluster.load(args.dir)
    ok = True
    print(f"cluster {c.prefix} ({c.subnet}) in {c.workdir}; ssh -F {c.ssh_config} HOST")
    for s in c.status():
        ok = ok and s["netns"] and s["sshd_alive"]
        print(
            f"  {s['name']:10} {s['addr']:15} netns={'yes' if s['netns'] else 'MISSING'} "
            f"sshd={s['sshd_pid']} {'up' if s['sshd_alive'] else 'DOWN'}"
        )
    return 0 if ok else 1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="testcluster", description="multi-host test cluster (netns + sshd)")
    ap.add_argument("--prefix", default="gl")
    ap.add_argument("--octet", type=int, default=213)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up")
    p.add_argument("n", nargs="?", type=int, default=3)
    p.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    for name in ("down", "status"):
        p = sub.add_parser(name)
        p.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    args.dir = os.path.abspath(args.dir)
    return {"up": _cli_up, "down": _cli_down, "status": _cli_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
