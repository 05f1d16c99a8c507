"""A real Slurm cluster on one machine, for tests of the slurm backend.

Each node is a network namespace with its own address and a UTS + private mount namespace (its
hostname, the cluster's /etc/hosts and resolv.conf bound over the real ones): one slurmd per node,
slurmctld and one munged in node 0. Slurm 22.05 from Debian (slurm-wlm, munge: installed by
scripts/install-system-deps.sh). Needs root. Standard library only.

Layout for prefix "gls", octet 215 and n nodes (a subnet of its own, next to the sshd cluster's 10.213):
  bridge gls-br0 10.215.0.1/24 (root namespace: srun and sbatch run there, slurmstepd calls back to it)
  node i: netns gls-nI, veth gls-hI / eth0 10.215.0.(10+I)/24, hostname gls-nI, slurmd -N gls-nI
Every client command needs SLURM_CONF (``env()``): without it Slurm looks for a controller in DNS.

Pitfalls measured while building it (see the notes in the shared notes' slurm-cluster.md):
- not `ip netns exec`: it remounts /sys, slurmd 22.05 then finds no /sys/fs/cgroup and refuses to start;
  nsenter --net + unshare --uts --mount keep the real /sys;
- slurmd does not create its spool directory; slurmctld must listen before slurmds register;
- slurmstepd ignores SIGTERM: it is SIGKILLed at once at teardown.

CLI: python -m tests.slurm.slurmcluster up [DIR] | down [DIR]   (a cluster to try things by hand)
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Optional

from tests.cluster.netcluster import (
    ClusterError,
    _alive,
    _ip_batch,
    _link_names,
    _Lock,
    _netns_names,
    _netns_pids,
    _run,
    _terminate,
    _write,
)

DAEMONS = ("munged", "slurmctld", "slurmscriptd", "slurmd", "slurmstepd")
REQUIRED = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "salloc",
    "sinfo",
    "scontrol",
    "squeue",
    "scancel",
    "ip",
    "nsenter",
    "unshare",
    "mount",
    "hostname",
)

CONF = """\
ClusterName={pfx}
SlurmctldHost={pfx}-n0({net}.10)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={base}/state
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdSpoolDir={base}/spool/%n
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmdLogFile={base}/log/slurmd-%n.log
# no cgroups: nothing here has a delegated cgroup tree. linuxproc follows parent links: a child
# whose parent exits first escapes it (the launcher's job-id teardown is what catches those).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# without these a job asked for while the previous one completes waits for the next pass (~3 s)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
MailProg=/bin/true
{nodes}
# jobs share nodes (tests run side by side); a job may put more tasks than CPUs on a node
PartitionName={pfx} Nodes={pfx}-n[0-{last}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def missing_requirements() -> list[str]:
    missing = [] if os.geteuid() == 0 else ["root (network namespaces, bind mounts, slurmd)"]
    return missing + [t for t in REQUIRED if shutil.which(t) is None]


def _topology() -> str:
    """The machine's real topology (slurmd -C): a node with fewer CPUs than that is drained."""
    out = _run(["slurmd", "-C"]).stdout.splitlines()[0].split()
    keep = ("CPUs=", "Boards=", "SocketsPerBoard=", "CoresPerSocket=", "ThreadsPerCore=")
    return " ".join(w for w in out if w.startswith(keep))


class SlurmCluster:
    def __init__(self, n: int, workdir: str, prefix: str = "gls", subnet_octet: int = 215, lock_timeout: float = 600.0):
        self.n, self.prefix, self.octet = n, prefix, subnet_octet
        self.net = f"10.{subnet_octet}.0"
        self.workdir = os.path.abspath(workdir)
        self.bridge = f"{prefix}-br0"
        self.names = [f"{prefix}-n{i}" for i in range(n)]
        self.addrs = [f"{self.net}.{10 + i}" for i in range(n)]
        self.veths = [f"{prefix}-h{i}" for i in range(n)]
        self.conf = os.path.join(self.workdir, "etc", "slurm.conf")
        # munged wants every directory above its socket searchable by all (pytest's are 0700)
        self.run_dir = f"/run/gaudi-launch-slurmcluster-{prefix}"
        self.munge_socket = os.path.join(self.run_dir, "munge.socket")
        self.lock_timeout = lock_timeout
        self._locks = [_Lock(f"prefix-{prefix}"), _Lock(f"net-10.{subnet_octet}")]
        self.daemons: dict[str, subprocess.Popen] = {}
        self._atexit = False
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------ public API
    def env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        """For every Slurm client command and the launcher: SLURM_CONF set (never a DNS lookup)."""
        env = dict(os.environ if base is None else base)
        for name in [k for k in env if k.startswith("SLURM_")]:
            del env[name]  # an allocation of another cluster (or of an outer test) must not leak in
        env["SLURM_CONF"] = self.conf
        return env

    def node_pid(self, i: int) -> int:
        return self.daemons[f"slurmd-{self.names[i]}"].pid

    def run_on(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """argv as node i sees it: its network, hostname and /etc/hosts."""
        cwd = os.path.abspath(kwargs.pop("cwd", os.getcwd()))
        return subprocess.run(
            ["nsenter", "-t", str(self.node_pid(i)), "-n", "-u", "-m", f"--wd={cwd}", "--", *argv], **kwargs
        )

    def job_processes(self, i: int) -> list[str]:
        """What runs in node i besides Slurm's own daemons: 'pid name' (zombies count as gone)."""
        out = []
        for pid in _netns_pids(self.names[i]):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and name not in DAEMONS:
                out.append(f"{pid} {name}")
        return out

    def __enter__(self) -> SlurmCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> SlurmCluster:
        missing = missing_requirements()
        if missing:
            raise ClusterError("cannot build a Slurm test cluster here, missing: " + ", ".join(missing))
        t0 = time.monotonic()
        info = {"pid": os.getpid(), "workdir": self.workdir, "prefix": self.prefix, "octet": self.octet}
        for lock in self._locks:
            lock.acquire(info, self.lock_timeout)
        self._atexit = True
        atexit.register(self.down)
        try:
            self._remove(self._ours(_netns_names(), _link_names()))  # a killed session's leftovers
            routed = _run(["ip", "-4", "route", "show", f"{self.net}.0/24"], check=False).stdout.strip()
            if routed:
                raise ClusterError(f"{self.net}.0/24 is already routed here: {routed}")
            self._write_files()
            self._build_network()
            self._start_daemons()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - t0
        return self

    def down(self) -> None:
        """Stop every process of the cluster (daemons, steps, tasks), remove its links and namespaces."""
        if self._atexit:
            atexit.unregister(self.down)
            self._atexit = False
        if not any(lock.fd is not None for lock in self._locks):
            return  # never built, or down already: nothing of ours exists
        t0 = time.monotonic()
        try:
            self._remove(self._ours(_netns_names(), _link_names()), list(self.daemons.values()))
            self.daemons.clear()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            for lock in self._locks:
                lock.release()
        self.timings["down"] = time.monotonic() - t0

    # ------------------------------------------------------------ building
    def _ours(self, netns: list[str], links: list[str]):
        return ([n for n in netns if n in self.names], [l for l in links if l in self.veths or l == self.bridge])

    def _write_files(self) -> None:
        base = self.workdir
        for d in ("state", "spool", "log"):  # an earlier cluster's jobs and node states: start afresh
            shutil.rmtree(os.path.join(base, d), ignore_errors=True)
        for d in ("etc", "run", "log", "state", "munge", *(f"spool/{n}" for n in self.names)):
            os.makedirs(os.path.join(base, d), exist_ok=True)
        os.chmod(os.path.join(base, "munge"), 0o700)
        shutil.rmtree(self.run_dir, ignore_errors=True)  # ours: the prefix lock is held
        os.makedirs(self.run_dir, 0o755)
        hosts = ["127.0.0.1 localhost", f"{self.net}.1 {self.bridge}"]
        for name, addr in zip(self.names, self.addrs):
            hosts += [f"{addr} {name}", f"::ffff:{addr} {name}"]  # gloo peers show up v4-mapped
        _write(os.path.join(base, "etc", "hosts"), "\n".join(hosts) + "\n")
        _write(os.path.join(base, "etc", "resolv.conf"), "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        topo = _topology()
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} NodeHostname={name} {topo} RealMemory=1000 State=UNKNOWN"
            for name, addr in zip(self.names, self.addrs)
        )
        # slurmd loads a cgroup plugin even with linuxproc; on a pure cgroup v2 host without systemd
        # its v2 plugin would otherwise look for systemd's scope (harmless on v1 hosts like this one)
        _write(os.path.join(base, "etc", "cgroup.conf"), "IgnoreSystemd=yes\n")
        _write(
            self.conf,
            CONF.format(pfx=self.prefix, net=self.net, base=base, nodes=nodes, last=self.n - 1, sock=self.munge_socket),
        )
        key = os.path.join(base, "munge", "munge.key")
        if not os.path.exists(key):
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))

    def _build_network(self) -> None:
        root = [
            f"link add {self.bridge} type bridge",
            f"addr add {self.net}.1/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for name, veth in zip(self.names, self.veths):
            root += [
                f"netns add {name}",
                f"link add {veth} type veth peer name eth0 netns {name}",
                f"link set {veth} master {self.bridge}",
                f"link set {veth} up",
            ]
        _ip_batch(root)
        for name, addr in zip(self.names, self.addrs):
            _ip_batch(["link set lo up", f"addr add {addr}/24 dev eth0", "link set eth0 up"], netns=name)

    def _on_node(self, i: int, label: str, argv: list[str]) -> None:
        """Start a daemon as node i, in the foreground: nsenter, unshare and sh all exec in place,
        so the Popen is the daemon itself."""
        script = (
            'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && hostname "$3" '
            '&& shift 3 && exec "$@"'
        )
        etc = os.path.join(self.workdir, "etc")
        with open(os.path.join(self.workdir, "log", f"{label}.out"), "ab") as log:
            self.daemons[label] = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{self.names[i]}",
                    "--",
                    "unshare",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                    os.path.join(etc, "hosts"),
                    os.path.join(etc, "resolv.conf"),
                    self.names[i],
                    *argv,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd="/",
            )

    def _wait(self, what: str, ready, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [k for k, p in self.daemons.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise ClusterError(
                    f"waiting for {what}: "
                    + (f"{dead[0]} exited" if dead else "timed out")
                    + f"; logs in {self.workdir}/log: {self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self) -> str:
        tails = []
        for name in sorted(os.listdir(os.path.join(self.workdir, "log"))):
            with open(os.path.join(self.workdir, "log", name), errors="replace") as f:
                text = f.read()[-400:].strip()
            if text:
                tails.append(f"[{name}] {text}")
        return " ".join(tails)[-3000:]

    def _client_ok(self, argv: list[str]) -> bool:
        return subprocess.run(argv, env=self.env(), capture_output=True, timeout=30).returncode == 0

    def _start_daemons(self) -> None:
        base = self.workdir
        sock = self.munge_socket
        # One munged for every node: a filesystem socket is reachable from every network namespace.
        self._on_node(
            0,
            "munged",
            [
                "munged",
                "-F",
                f"--socket={sock}",
                f"--key-file={base}/munge/munge.key",
                f"--pid-file={base}/run/munged.pid",
                f"--log-file={base}/log/munged.log",
                f"--seed-file={base}/munge/munged.seed",
                f"--origin={self.addrs[0]}",
            ],
        )
        self._wait("munged", lambda: os.path.exists(sock))
        self._on_node(0, "slurmctld", ["slurmctld", "-D", "-f", self.conf])
        self._wait("slurmctld", lambda: self._client_ok(["scontrol", "ping"]))
        for i, name in enumerate(self.names):
            self._on_node(i, f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", self.conf])

        def all_idle() -> bool:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True, text=True, timeout=30
            ).stdout.split()
            return out[1::2].count("idle") == self.n

        self._wait(f"{self.n} idle nodes", all_idle)

    # ------------------------------------------------------------ teardown
    def _remove(self, ours, popens: Sequence[subprocess.Popen] = ()) -> None:
        netns, links = ours
        pids: dict[int, Optional[int]] = {}
        for ns in netns:
            pids.update(_netns_pids(ns))
        for pid in list(pids):  # slurmstepd ignores SIGTERM: it would cost the whole grace
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "slurmstepd":
                        os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _terminate(list(popens), pids, grace=2.0)
        veths = [l for l in links if l != self.bridge]
        cmds = [f"link del {l}" for l in veths] + [f"netns del {ns}" for ns in netns]
        if self.bridge in links:
            cmds.append(f"link del {self.bridge}")
        if cmds:
            r = _run(["ip", "-force", "-batch", "-"], check=False, input="\n".join(cmds) + "\n")
            left = [x for group in self._ours(_netns_names(), _link_names()) for x in group]
            if left:
                raise ClusterError(f"teardown left {left}: {r.stderr.strip()}")
        alive = [pid for pid, start in pids.items() if _alive(pid, start)]
        if alive:
            raise ClusterError(f"teardown left processes {alive}")


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("up", "down"):
        print("usage: python -m tests.slurm.slurmcluster up|down [DIR]", file=sys.stderr)
        return 2
    workdir = args[1] if len(args) > 1 else "/tmp/gaudi-launch-slurm"
    c = SlurmCluster(3, workdir, lock_timeout=0)
    if args[0] == "down":
        c._locks = []  # a cluster another process left: remove by name
        c._remove(c._ours(_netns_names(), _link_names()))
        shutil.rmtree(c.run_dir, ignore_errors=True)
        print("down")
        return 0
    c.up()
    for lock in c._locks:  # leave it running: the locks go with this process, the cluster stays
        lock.release()
    atexit.unregister(c.down)
    print(f"up in {c.timings['up']:.2f} s: export SLURM_CONF={shlex.quote(c.conf)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
