"""Launch cost against the number of hosts: gaudi-launch (tree and flat fan-out) next to raw mpirun, 16..64 hosts.

Every configuration starts one rank per host running `/bin/true` (`--no_python`), so nothing is
measured but launching: ssh, the pre-flight, mpirun's daemons, the end-of-job sweep. The hosts are a
namespace cluster this script builds (tests/cluster/netcluster.py, prefix "glb", subnet 10.221.0.0/24,
one sshd per host; never the tests' clusters) and every launcher runs "on" its first host with the
cluster's ssh wrapper first on PATH, as a user on a login node that is also host 0 would.

    .venv/bin/python scripts/bench/bench_scale.py [--hosts 16,32,64] [--repeats 3] [--all-rows] [--json out.json]

The rows (issue 34): gaudi-launch with `--fan-out tree` (the pre-flight as one probe per node through
mpirun's daemon tree, the job's mpirun with its tree spawn) and `--fan-out flat` (one ssh per host from
the launcher), both with the pre-flight, against raw `mpirun --host` with its defaults (tree spawn,
radix 64). `--all-rows` adds the older rows (`--check-only`, `--no-ssh-check`, no sharing, daemons by
ssh, a Python rank, raw pdsh; `--deepspeed` DeepSpeed's). Rows of each round are interleaved (every
host count and configuration once per round, the order rotated each round), so load on this shared
machine hits them alike. Printed: the median of the rounds per host count, its ratio to raw mpirun at
the same host count, per configuration the least-squares slope in seconds per host, the memory the
cluster holds, the issue's targets (met or not), then per-host costs measured on the cluster (a
handshake, a session over an open connection, the pre-flight's probe, one level of OpenMPI's tree: a
chain of daemons, routed_radix 1), the plan's scale (dry runs of 1,000 and 10,000 hosts x 8) and a model
of launch time at 16..4,096 hosts built from those costs, with its assumptions and the host count where
the tree overtakes the flat path (plan/fanoutmode.py ONE_PASS_FROM_HOSTS). A benchmark, not a test: it
passes or fails on nothing but a launch that did not exit 0 (exit status 1 then).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_launch import byte_compile_package, environment, environment_line, timed, venv_tool  # noqa: E402

BASELINE = "mpirun (raw)"
TREE, FLAT = "gaudi-launch, tree", "gaudi-launch, flat"
TREE3 = "gaudi-launch, tree, three passes"  # GAUDI_LAUNCH_TREE_PASSES=3: the probe, the job and the sweep apart
CORE_ROWS = (TREE, TREE3, FLAT, BASELINE)
PREFIX, OCTET = "glb", 221
MODEL_SIZES = (16, 64, 128, 1024, 4096)


# The Python every launch runs (the launcher, mpirun's tree hops, the ranks' bootstrap, the probe's checks):
# main() sets it to installed_python's unless --dev-python.
PYTHON = sys.executable


def installed_python(workdir: str) -> str:
    """A Python as a user's wheel install gives it: a venv of this interpreter's base, with this checkout and the
    development venv's site-packages on its path as plain directories. The development install is editable: its
    .pth file loads setuptools' finder at every interpreter start (pathlib, urllib.parse, ipaddress: about 20 ms
    of CPU here), which a wheel install does not, and a launch starts several interpreters per host."""
    import site
    import venv

    home = os.path.join(workdir, "installed")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    packages = os.path.join(home, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    with open(os.path.join(packages, "gaudi_launch_checkout.pth"), "w") as f:
        f.write("\n".join([ROOT, *site.getsitepackages()]) + "\n")  # directories only: no .pth of theirs runs
    return os.path.join(home, "bin", "python")


def gl_argv() -> list[str]:
    # `python -m gaudi_launch` from this checkout (the console script may point at another one)
    return [PYTHON, "-m", "gaudi_launch"]


def fan_out_option() -> bool:
    """This checkout's gaudi-launch has --fan-out (issue 34's tree)."""
    try:
        from gaudi_launch.inputs.spec import FAN_OUT_MODES  # noqa: F401
    except ImportError:
        return False
    return True


def one_pass_built() -> bool:
    """This checkout's tree runs in one pass (issue 34: remote/onepass.py)."""
    return importlib.util.find_spec("gaudi_launch.remote.onepass") is not None


def configs(deepspeed: bool = False, all_rows: bool = False) -> list[tuple[str, callable]]:
    """(name, build(cluster, hostfile, n, workdir) -> argv): the core rows, then with all_rows the older ones."""

    def gl(*extra):
        return lambda c, hf, n, wd: gl_argv() + ["--hostfile", hf, "--ssh-config", c.ssh_config, *extra]

    def raw_mpirun_of(*program):
        return lambda c, hf, n, wd: (
            ["mpirun"]
            + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + ["-n", str(n), "--host", ",".join(f"{h.name}:1" for h in c.hosts[:n])]
            + [os.path.join(wd, p) for p in program]  # relative to the workdir; absolute paths stay
        )

    def raw_pdsh(c, hf, n, wd):
        return ["pdsh", "-R", "ssh", "-w", ",".join(h.name for h in c.hosts[:n]), "/bin/true"]

    job = ("--backend", "mpirun", "--no_python", "/bin/true")
    out = []
    if fan_out_option():
        out += [(TREE, gl("--fan-out", "tree", *job)), (FLAT, gl("--fan-out", "flat", *job))]
        if one_pass_built():  # the tree's default is one pass (remote/onepass.py): the three-pass tree beside it
            out += [
                (
                    TREE3,
                    lambda c, hf, n, wd: (
                        ["env", "GAUDI_LAUNCH_TREE_PASSES=3"] + gl("--fan-out", "tree", *job)(c, hf, n, wd)
                    ),
                )
            ]
    else:  # before issue 34: one path, today's flat one
        out += [(FLAT, gl(*job))]
    out += [(BASELINE, raw_mpirun_of("/bin/true"))]
    if not all_rows:
        return out
    out += [
        ("gaudi-launch --check-only", gl("--check-only")),
        ("gaudi-launch mpirun", gl(*job)),
        ("gaudi-launch mpirun --no-ssh-check", gl("--backend", "mpirun", "--no-ssh-check", "--no_python", "/bin/true")),
        # the same job without the shared connections: a handshake for every ssh, as before issue 18
        (
            "gaudi-launch mpirun, no sharing",
            lambda c, hf, n, wd: ["env", "GAUDI_LAUNCH_SSH_SHARE=0"] + gl(*job)(c, hf, n, wd),
        ),
        # mpirun's daemons by its own ssh over the shared connections (a session, so a login shell, of
        # their own per host), not through the pre-flight's session: a user's OMPI_MCA_plm_rsh_agent is kept
        (
            "gaudi-launch mpirun, daemons by ssh",
            lambda c, hf, n, wd: ["env", "OMPI_MCA_plm_rsh_agent=ssh"] + gl(*job)(c, hf, n, wd),
        ),
        # A Python rank (an empty script) on both sides: what a training job's launch pays. Ours starts
        # it through the rank bootstrap as every rank does; /bin/true above starts through it too
        # (--no_python), where raw mpirun starts no Python at all.
        (
            "gaudi-launch mpirun, a Python rank",
            lambda c, hf, n, wd: gl("--backend", "mpirun")(c, hf, n, wd) + [os.path.join(wd, "noop.py")],
        ),
        ("mpirun (raw), a Python rank", raw_mpirun_of(PYTHON, "noop.py")),
        ("pdsh (raw)", raw_pdsh),
    ]
    if deepspeed:

        def ds_raw(c, hf, n, wd):
            return [
                venv_tool("deepspeed") or "deepspeed",
                "--hostfile",
                hf,
                "--master_addr",
                c.hosts[0].name,
                "--launcher",
                "pdsh",
                os.path.join(wd, "noop.py"),
            ]

        out += [
            (
                "gaudi-launch deepspeed",
                lambda c, hf, n, wd: gl("--backend", "deepspeed")(c, hf, n, wd) + [os.path.join(wd, "noop.py")],
            ),
            ("deepspeed (raw, pdsh)", ds_raw),
        ]
    return out


def slope(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of y over x (seconds per host). Pure."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


# ---------------------------------------------------------------------------------------------
# Launches


class MemoryWatch:
    """The machine's MemAvailable, sampled every `every` s on a thread while the launches run: the lowest
    seen tells what the cluster and the launches on it cost at most."""

    def __init__(self, every: float = 0.25):
        self.every, self.lowest_kib = every, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def available_kib() -> Optional[int]:
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.available_kib()
            if now is not None and (self.lowest_kib is None or now < self.lowest_kib):
                self.lowest_kib = now
            self._stop.wait(self.every)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(
    cluster,
    counts: list[int],
    rounds: int,
    warmup: int,
    cfgs: list[tuple[str, callable]],
    workdir: str,
    env: dict[str, str],
    timeout: float,
    budget_s: Optional[float] = None,
) -> dict[str, dict[int, dict]]:
    """Medians of `rounds` measured rounds after `warmup`; with `budget_s`, no round is started that the
    last one's length says would end past it (at least one measured round always runs)."""
    hostfiles = {n: cluster.hostfile(slots=1, hosts=range(n)) for n in counts}
    results: dict[str, dict[int, dict]] = {name: {n: {"seconds": []} for n in counts} for name, _ in cfgs}
    t0 = last = time.monotonic()
    for r in range(warmup + rounds):
        now = time.monotonic()
        if budget_s is not None and r > warmup and now + (now - last) - t0 > budget_s:
            print(f"  stopping after {r - warmup} round(s): the next would pass the budget", file=sys.stderr)
            break
        last = now
        order = cfgs[r % len(cfgs) :] + cfgs[: r % len(cfgs)]
        # host counts alternate up and down, rounds alike; a warm-up round (caches, compiled modules) runs
        # the smallest count only
        for n in counts[:1] if r < warmup else counts if r % 2 == 0 else counts[::-1]:
            for name, build in order:
                argv = build(cluster, hostfiles[n], n, workdir)
                seconds, code, out = timed(argv, env, workdir, timeout, cluster)
                entry = results[name][n]
                entry["command"] = shlex.join(argv)
                if code != 0:
                    entry["error"] = f"exit {code}: {out.strip()[-600:]}"
                    print(f"  {name} x{n}: FAILED ({entry['error'][:200]})", file=sys.stderr, flush=True)
                elif r >= warmup:
                    entry["seconds"].append(seconds)
                print(
                    f"  round {r + 1 - warmup if r >= warmup else 'warm-up'}: {name} x{n}: {seconds:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    for per in results.values():
        for entry in per.values():
            if entry["seconds"]:
                entry["median"] = statistics.median(entry["seconds"])
    return results


# ---------------------------------------------------------------------------------------------
# Where a launch's CPU goes, by process (the kernel's process accounting)

ACCT_ROLES = (
    "ssh",
    "orted",
    "sshd, login shells, mpirun, tools",
    "Python: rank bootstraps",
    "Python: tree hops",
    "Python: the launcher",
    "Python: other",
)


def acct_records(path: str) -> list[dict]:
    """The records of a process-accounting file (Debian's acct, `dump-acct`): command, CPU seconds (user + system,
    in the kernel's 1/100 s ticks), pid, parent pid, whether it forked without an exec (F)."""
    out = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    records = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 12:
            continue
        records.append(
            {
                "comm": f[0],
                "cpu": (float(f[2]) + float(f[3])) / 100,
                "pid": int(f[9]),
                "ppid": int(f[10]),
                "forked": "F" in f[11],
            }
        )
    return records


def acct_roles(records: list[dict], roots: set[int]) -> dict[str, tuple[float, int]]:
    """{role: (CPU seconds, processes)} of the records that descend from ``roots`` (the bench, which starts the
    launcher, and the hosts' sshd), or from a process that ended before them (a record keeps its parent at its
    exit: an orphan's is 1). A Python is a rank bootstrap under an orted or started by mpirun itself (host
    0's), a tree hop where it started an ssh, the launcher where it started mpirun outside both; a fork without an
    exec counts with the process it forked from. Pure."""
    by_pid = {r["pid"]: r for r in records}
    children: dict[int, list[dict]] = {}
    for r in records:
        children.setdefault(r["ppid"], []).append(r)

    def ancestors(r: dict) -> list[dict]:
        chain, seen = [], set()
        while r["ppid"] in by_pid and r["ppid"] not in seen:
            seen.add(r["ppid"])
            r = by_pid[r["ppid"]]
            chain.append(r)
        return chain

    def python_role(r: dict) -> str:
        above = ancestors(r)
        while r["forked"] and above and above[0]["comm"] == r["comm"]:  # a fork: its parent's role
            r, above = above[0], above[1:]
        kids = {c["comm"] for c in children.get(r["pid"], [])}
        if "ssh" in kids:
            return "Python: tree hops"
        if any(a["comm"] == "orted" for a in above) or (above and above[0]["comm"] == "mpirun"):
            return "Python: rank bootstraps"
        if "mpirun" in kids:
            return "Python: the launcher"
        return "Python: other"

    out: dict[str, list] = {role: [0.0, 0] for role in ACCT_ROLES}

    def ours(r: dict) -> bool:  # under a root, or an orphan (its parent ended in the window: ours, on a quiet bench)
        top = (ancestors(r) or [r])[-1]
        return top["ppid"] in roots or top["ppid"] == 1

    for r in records:
        if not ours(r):
            continue
        if r["comm"] in ("ssh", "orted"):
            role = r["comm"]
        elif r["comm"].startswith("python"):
            role = python_role(r)
        else:
            role = "sshd, login shells, mpirun, tools"
        out[role][0] += r["cpu"]
        out[role][1] += 0 if r["forked"] else 1
    return {role: (cpu, n) for role, (cpu, n) in out.items()}


def cpu_by_process(cluster, cfgs, n: int, repeats: int, workdir: str, env: dict[str, str], timeout: float) -> dict:
    """CPU per launch by process, one pass against raw mpirun at ``n`` hosts: ``repeats`` launches of each after a
    warm-up, under the kernel's process accounting (root, Debian's acct: accton, dump-acct)."""
    builds = dict(cfgs)
    hostfile = cluster.hostfile(slots=1, hosts=range(n))
    roots = {os.getpid()} | {h.sshd_pid for h in cluster.hosts if h.sshd_pid}
    result = {}
    for name in (TREE, BASELINE):
        argv = builds[name](cluster, hostfile, n, workdir)
        timed(argv, env, workdir, timeout, cluster)
        path = os.path.join(workdir, "acct")
        open(path, "w").close()
        subprocess.run(["accton", path], check=True, capture_output=True)
        try:
            walls = [timed(argv, env, workdir, timeout, cluster)[0] for _ in range(repeats)]
        finally:
            subprocess.run(["accton", "off"], check=True, capture_output=True)
        roles = acct_roles(acct_records(path), roots)
        result[name] = {
            "wall_median": statistics.median(walls),
            "per_launch": {
                role: {"cpu": cpu / repeats, "processes": count / repeats} for role, (cpu, count) in roles.items()
            },
        }
    return {"hosts": n, "repeats": repeats, "rows": result}


# ---------------------------------------------------------------------------------------------
# Per-host costs, for the model


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def per_host_costs(cluster, env: dict[str, str], workdir: str, samples: int = 5) -> dict[str, float]:
    """Median wall time (and this side's CPU) of: a full ssh session (handshake + remote shell), opening
    a ControlMaster (handshake only), a session over it (remote shell only), the pre-flight's probe over
    it, measured from host 0 to the others one at a time. The remote shell includes the login files."""
    from gaudi_launch.remote import probe

    ctl = tempfile.mkdtemp(prefix="glb-", dir="/tmp")
    ssh = ["ssh", "-F", cluster.ssh_config]
    mux = ["-o", f"ControlPath={ctl}/%C"]
    probe_line = probe.command(PYTHON, None, ROOT, cluster.hosts[0].name, 22, None)
    tree_hop = importlib.util.find_spec("gaudi_launch.remote.treehop") is not None
    rows: dict[str, list[float]] = {"session": [], "handshake": [], "mux_session": [], "probe": [], "rsh_agent": []}
    rows.update({"tree_hop": []} if tree_hop else {})
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    targets = [h.name for h in cluster.hosts[1:]][:samples] or [cluster.hosts[0].name]

    def one(key: str, argv: list[str]) -> None:
        c0 = _children_cpu()
        t0 = time.perf_counter()
        done = cluster.run_on(0, argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True)
        rows[key].append(time.perf_counter() - t0)
        cpu[key].append(_children_cpu() - c0)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: exit {done.returncode}: {done.stderr.decode()[-300:]}")

    try:
        for host in targets:
            one("session", ssh + [host, "true"])
            one("handshake", ssh + mux + ["-o", "ControlMaster=yes", "-o", "ControlPersist=30", "-fN", host])
            one("mux_session", ssh + mux + ["-o", "ControlMaster=no", host, "true"])
            one("probe", ssh + mux + ["-o", "ControlMaster=no", host, probe_line])
            # what a daemon's start through the pre-flight's session costs this side: our rsh agent's
            # interpreter and imports (gaudi_launch/remote/rshagent.py; its request is one line over a socket)
            one("rsh_agent", [PYTHON, "-S", "-I", "-c", "import _socket, os, sys"])
            if tree_hop:  # the tree pre-flight's ssh on each host with children: a Python start and imports
                one("tree_hop", [PYTHON, "-c", "import gaudi_launch.remote.treehop"])
    finally:
        for host in targets:
            cluster.run_on(0, ssh + mux + ["-O", "exit", host], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", ctl])
    out = {k: statistics.median(v) for k, v in rows.items() if v}
    out.update({f"{k}_local_cpu": statistics.median(v) for k, v in cpu.items() if v})
    return out


def fixed_parts(cluster, env: dict[str, str], workdir: str, samples: int = 3) -> dict[str, float]:
    """The launchers' own start-up, which no host count changes: raw mpirun with host 0 alone (no ssh, one
    local daemon-less rank) and gaudi-launch's flat path on host 0 alone (no pre-flight for this host, the
    same mpirun under it), median of `samples`, from host 0."""
    hf = cluster.hostfile(slots=1, hosts=[0])
    cfgs = dict(configs())
    out = {}
    for key, name in (("mpirun_fixed", BASELINE), ("gaudi_launch_one_host", FLAT)):
        argv = cfgs[name](cluster, hf, 1, workdir)
        times = []
        for _ in range(samples):
            seconds, code, text = timed(argv, env, workdir, 120, cluster)
            if code != 0:
                raise RuntimeError(f"{shlex.join(argv)}: exit {code}: {text[-300:]}")
            times.append(seconds)
        out[key] = statistics.median(times)
    out["ours_fixed"] = max(0.0, out["gaudi_launch_one_host"] - out["mpirun_fixed"])
    return out


def tree_level(cluster, env: dict[str, str], workdir: str, samples: int = 3) -> dict:
    """Seconds one level of OpenMPI's daemon tree adds: raw mpirun over a chain of k hosts (routed_radix 1,
    so each daemon starts the next by ssh: k - 1 levels below mpirun on host 0), k = 2, 4, 8 (as many as
    the cluster has), median of `samples`; the least-squares slope over the levels. A chain keeps one
    handshake at a time, so the 2 shared cores are not what it measures. The daemons' own ssh reads the
    cluster's config (plm_rsh_args, passed down the tree)."""
    ks = sorted({k for k in (2, 4, 8) if k <= cluster.n} | ({cluster.n} if 2 <= cluster.n < 8 else set()))
    by_k: dict[int, float] = {}
    for k in ks:
        argv = (
            ["mpirun"]
            + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + ["-n", str(k), "--host", ",".join(f"{h.name}:1" for h in cluster.hosts[:k])]
            + ["--mca", "routed", "radix", "--mca", "routed_radix", "1"]
            + ["--mca", "plm_rsh_args", f"-F {cluster.ssh_config}", "/bin/true"]
        )
        times = []
        for _ in range(samples):
            seconds, code, out = timed(argv, env, workdir, 120, cluster)
            if code != 0:
                raise RuntimeError(f"{shlex.join(argv)}: exit {code}: {out[-300:]}")
            times.append(seconds)
        by_k[k] = statistics.median(times)
    per_level = slope([(k - 1, t) for k, t in by_k.items()])
    return {"chain_seconds": {str(k): t for k, t in by_k.items()}, "per_level": per_level}


# What a rank that connects back to the one-pass gate does (process/gate.py), for gate_cost's clients: many at
# once over a pool of threads; each sends its hello (a host's first rank with a probe's output), reads its
# verdict; the host's last one then its "swept" line; each closes. Run as a process of its own, so its CPU is
# not the launcher's.
_GATE_CLIENTS = """
import os, socket, sys, threading
from concurrent.futures import ThreadPoolExecutor
from gaudi_launch.remote import gatewire
port, key, hosts, per_host, probe_bytes = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), *map(int, sys.argv[3:6])
probe = "x" * probe_bytes
go_all = threading.Barrier(hosts * per_host)
def rank(r):
    h, nonce = r // per_host, os.urandom(16).hex()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(gatewire.hello(key, str(r), f"h{h}", probe if r % per_host == 0 else None, nonce))
    f = s.makefile("rb")
    assert gatewire.read_verdict(key, nonce, f.readline()) is not None
    go_all.wait()
    if r % per_host == per_host - 1:
        s.sendall(gatewire.swept_line(key, nonce, f"h{h}", 0))
    s.close()
with ThreadPoolExecutor(hosts * per_host) as pool:
    list(pool.map(rank, range(hosts * per_host)))
"""


def gate_cost(hosts: int = 512, per_host: int = 2, probe_bytes: int = 4096, samples: int = 3) -> dict:
    """The launcher's CPU per connection at the one-pass gate (remote/onepass.GateServer, one selector thread):
    each connection accepted, its hello checked, its verdict (the host's variables) signed and sent; per host
    (``per_host`` 2, as process/gate.py makes them) the first rank's with the probe's output, and the last
    rank's "swept" on one of its own. ``hosts`` x ``per_host`` connections from a process of their own on this
    machine (loopback), the gate in this process; this process's CPU from the first connection to the last
    close, median of ``samples``, per connection."""
    from types import SimpleNamespace

    from gaudi_launch.remote.onepass import GateServer

    env = {
        "GAUDI_LAUNCH_SOCKET_IFNAME": "eth0",
        "HCCL_SOCKET_IFNAME": "eth0",
        "GAUDI_LAUNCH_HOST_CARDS": '{"layouts":[[[0,1,2,3,4,5,6,7],[],["h"]]]}',
    }
    per_conn = []
    for _ in range(samples):
        nodes = [
            SimpleNamespace(host=f"h{h}", ranks=list(range(h * per_host, (h + 1) * per_host))) for h in range(hosts)
        ]
        gate = GateServer(SimpleNamespace(nodes=nodes), bind_addr="127.0.0.1")
        try:
            gate.decide(True, {n.host: env for n in nodes})
            c0 = time.process_time()
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _GATE_CLIENTS,
                    str(gate.port),
                    gate.key.hex(),
                    str(hosts),
                    str(per_host),
                    str(probe_bytes),
                ],
                env={**os.environ, "PYTHONPATH": ROOT},
                capture_output=True,
                timeout=300,
            )
            gate.wait_closed(30)
            cpu = time.process_time() - c0
        finally:
            gate.close()
        if done.returncode != 0:
            raise RuntimeError(f"gate clients: exit {done.returncode}: {done.stderr.decode()[-500:]}")
        per_conn.append(cpu / (hosts * per_host))
    return {"connections": hosts * per_host, "per_host": per_host, "per_connection_cpu": statistics.median(per_conn)}


# ---------------------------------------------------------------------------------------------
# Plans at scale (no cluster needed)


def plan_scale(workdir: str, env: dict[str, str], sizes=(1000, 10000), per_host: int = 8) -> dict[int, dict]:
    out = {}
    for n in sizes:
        hf = os.path.join(workdir, f"hostfile.{n}")
        with open(hf, "w") as f:
            f.writelines(f"node{i:05d}.cluster.example slots={per_host}\n" for i in range(n))
        argv = gl_argv() + [
            "--hostfile",
            hf,
            "--backend",
            "mpirun",
            "--no-ssh-check",
            "--dry-run",
            "--json",
            "--no_python",
            "/bin/true",
        ]
        times, plan = [], None
        for _ in range(3):
            t0 = time.perf_counter()
            done = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                out[n] = {"error": done.stderr[-400:]}
                break
            plan = json.loads(done.stdout)
        if plan is not None:
            mpirun = plan["commands"][0]["argv"]
            out[n] = {
                "dry_run_s": statistics.median(times),
                "argv_args": len(mpirun),
                "longest_arg_bytes": max(len(a.encode()) for a in mpirun),
                "argv_bytes": sum(len(a.encode()) + 1 for a in mpirun),
            }
    return out


# ---------------------------------------------------------------------------------------------
# The model


def tree_depth(hosts: int, radix: int) -> int:
    """Levels of ssh hops below mpirun for `hosts` daemons in OpenMPI's radix tree (mpirun's children are
    vpids 1..r, theirs the next r*r, ...): 1 up to r hosts, 2 up to r + r*r. Pure."""
    levels, reach, width = 0, 0, 1
    while reach < hosts:
        width *= radix
        reach += width
        levels += 1
    return levels


def model(
    costs: dict[str, float],
    fit: dict[str, tuple[float, float]],
    sizes=MODEL_SIZES,
    pool: int = 512,
    radix: int = 64,
    cores: int = 8,
    tree_sweep: str = "tree",
    gate_connections: int = 2,
) -> tuple[list[str], dict[str, dict[int, float]], Optional[int]]:
    """Launch time against hosts on a real cluster (every host its own machine), from costs measured here.

    Assumptions, printed with the result:
    - remote work runs in parallel on the hosts (here it shares 2 cores: the measured slopes are
      mostly that, and do not carry over);
    - what grows with the host count is CPU on the host that starts others: per child an ssh client
      (`handshake_local_cpu`) and, on the launcher's flat path, a multiplexed session and our rsh agent,
      spread over `cores` cores, plus rounds of the pre-flight's bounded pool;
    - OpenMPI's tree (radix `radix`, depth 1 up to radix hosts, 2 up to radix + radix^2): each level costs
      one level of the chain measured here (a daemon's ssh, login shell, orted start and call back:
      `tree_level`) plus its parent's CPU for its other children; the levels run one after the other;
    - raw mpirun: its fixed part (intercept of its fit here) and one pass down the tree;
    - gaudi-launch, flat: our fixed part (the flat fit's intercept over raw mpirun's), the pre-flight
      (one ControlMaster and probe per host, rounds of `pool`), mpirun's daemons through the pre-flight's
      sessions (our rsh agent: one level, no new handshake), the end-of-job sweep over the open sessions
      (0.05 s);
    - gaudi-launch, tree (one pass, the tree's default: remote/onepass.py): our fixed part and the job's one
      mpirun (its fixed part, a pass down the tree with our tree hop beside each child's ssh), the probe on
      the hosts (each host's first rank runs it before the go), each rank's connection back to the launcher
      at the gate (`gate_connection_local_cpu`, measured on loopback by `gate_cost`): two a host (its first
      rank's, which the host's other ranks share through the job directory, and its last rank's saying it
      swept, when that is another rank), all of it on the path (one thread takes them, and the verdicts go out
      after the last probe),
      no sweep pass (each host's last rank sweeps it);
    - gaudi-launch, tree, three passes (GAUDI_LAUNCH_TREE_PASSES=3): our fixed part, the pre-flight as its own mpirun (its fixed part, a pass down
      the tree with our tree hop (a Python start, `tree_hop_local_cpu`) beside each child's ssh, the
      probe on the hosts), then the job's mpirun (its fixed part and a pass down the tree), then the
      end-of-job sweep `tree_sweep`: "ssh", one new ssh session per host from the launcher (a session's
      time, and a handshake's CPU per host over `cores`), "tree", one more pass down the tree with
      mpirun's fixed part, or "none";
    - the fixed parts: raw mpirun's and gaudi-launch's (over raw mpirun's) time with host 0 alone, no
      ssh (without that measurement: the fits' intercepts);
    - the crossover is the fewest hosts from which the tree is never slower than the flat path (the
      model, scanned host by host to 8,192), what auto's ONE_PASS_FROM_HOSTS should be.
    """
    hs, sess, mux, probe = costs["handshake"], costs["session"], costs["mux_session"], costs["probe"]
    c_hs = costs.get("handshake_local_cpu", 0.0)
    c_mux = costs.get("mux_session_local_cpu", 0.0)
    rsh, c_rsh = costs.get("rsh_agent", 0.0), costs.get("rsh_agent_local_cpu", 0.0)
    c_hop = costs.get("tree_hop_local_cpu", 0.0)
    c_gate = costs.get("gate_connection_local_cpu", 0.0)
    level = costs.get("tree_level") or sess + mux  # the chain's slope; else a session and a daemon's shell
    if "mpirun_fixed" in costs:  # measured on host 0 alone (fixed_parts)
        mpirun_fixed, ours_fixed, where = costs["mpirun_fixed"], costs["ours_fixed"], "measured on host 0 alone"
    else:  # the intercepts of the fits, our part less the flat path's own fixed pieces
        mpirun_fixed = max(0.0, fit[BASELINE][0]) if BASELINE in fit else 0.3
        flat_pieces = hs + probe + rsh + 0.05
        ours_fixed = max(0.0, fit[FLAT][0] - fit[BASELINE][0] - flat_pieces) if FLAT in fit and BASELINE in fit else 0.3
        where = "intercepts of the fits here"
    lines = [
        f"measured per host here (median, from host 0): full ssh session {sess:.3f} s, handshake "
        f"(ControlMaster open) {hs:.3f} s, session over an open connection {mux:.3f} s, pre-flight probe "
        f"over it {probe:.3f} s, our rsh agent (a daemon's start through the session) {rsh:.3f} s, one level of "
        f"OpenMPI's tree (a chain of daemons, routed_radix 1) {level:.3f} s; CPU on the starting side per "
        f"handshake {c_hs:.3f} s, per multiplexed session {c_mux:.3f} s, per rsh agent {c_rsh:.3f} s, per tree "
        f"hop {c_hop:.3f} s, per connection at the one-pass gate {c_gate * 1000:.2f} ms (one thread)",
        f"fixed parts ({where}): raw mpirun {mpirun_fixed:.2f} s, gaudi-launch's own start-up over that "
        f"{ours_fixed:.2f} s",
        f"assumed: every host its own machine (remote work in parallel), {cores} cores on every host that "
        f"starts others (the launcher, a tree's inner daemons), pre-flight pool {pool}, OpenMPI tree radix "
        f"{radix}, the tree path's end-of-job sweep: {tree_sweep}, {gate_connections} gate connections per host",
        "not in these figures: hl-smi (no Gaudi here). On an 8-card Gaudi host the probe adds 4 hl-smi calls one "
        "after another (the rest side by side; 30 before), each at the tool's own latency, alike on every path",
    ]

    def tree_pass(n: int, child_cpu: float) -> float:
        depth = tree_depth(n, radix)
        return depth * (level + (min(n, radix) - 1) * child_cpu / cores)

    def raw(n: int) -> float:
        return mpirun_fixed + tree_pass(n, c_hs)

    def flat(n: int) -> float:
        pre = math.ceil(n / pool) * (hs + probe) + n * (c_hs + c_mux) / cores
        job = rsh + n * c_rsh / cores  # daemons through the pre-flight's sessions
        return mpirun_fixed + ours_fixed + pre + job + 0.05

    def tree(n: int) -> float:
        pre = mpirun_fixed + tree_pass(n, c_hs + c_hop) + probe
        job = tree_pass(n, c_hs)
        sweep = {
            "ssh": sess + n * c_hs / cores,
            "tree": mpirun_fixed + tree_pass(n, c_hs),
            "none": 0.0,
        }[tree_sweep]
        return mpirun_fixed + ours_fixed + pre + job + sweep

    def one_pass(n: int) -> float:  # the probe and the sweep ride the job's own daemons and ranks
        return mpirun_fixed + ours_fixed + tree_pass(n, c_hs + c_hop) + probe + n * gate_connections * c_gate

    out: dict[str, dict[int, float]] = {
        "mpirun (raw, tree spawn)": {n: raw(n) for n in sizes},
        FLAT: {n: flat(n) for n in sizes},
        TREE: {n: one_pass(n) for n in sizes},
        TREE3: {n: tree(n) for n in sizes},
    }
    crossover = None
    for n in range(8192, 1, -1):  # the fewest hosts from which the tree (one pass) is never slower
        if one_pass(n) > flat(n):
            crossover = n + 1 if n < 8192 else None
            break
    else:
        crossover = 2
    return lines, out, crossover


def targets(res: dict, tree_from: Optional[int]) -> list[dict]:
    """The issue's three targets against this run: what each compares, the figures, met or not. Pure.
    Judged on auto's mode at that host count (flat below `tree_from` remote hosts, tree from it) when
    both were run; the other mode's figure is given beside it ("other")."""
    launches, fits = res["launches"], res["fits"]
    counts = res["config"]["hosts"]

    def median(name: str, n: int) -> Optional[float]:
        return launches.get(name, {}).get(str(n), {}).get("median")

    def auto(n: int) -> str:
        if TREE not in launches:
            return FLAT
        return TREE if tree_from is not None and n - 1 >= tree_from else FLAT  # remote hosts: all but host 0

    def other(mode: str) -> Optional[str]:
        alt = FLAT if mode == TREE else TREE
        return alt if alt in launches else None

    out = []
    raw16 = median(BASELINE, 16)
    if 16 in counts and raw16:
        mode = auto(16)
        ours = median(mode, 16)
        if ours:
            alt = other(mode)
            t = {
                "target": "16 hosts, pre-flight included: <= 1.25x raw mpirun",
                "mode": mode,
                "figure": f"{ours / raw16:.2f}x ({ours:.2f} s against {raw16:.2f} s)",
                "met": ours / raw16 <= 1.25,
            }
            if alt and median(alt, 16):
                t["other"] = f"{alt} {median(alt, 16) / raw16:.2f}x"
            out.append(t)
    if len(counts) >= 2 and BASELINE in fits:
        mode = auto(counts[-1])
        if mode in fits:
            ours, raw = fits[mode][1], fits[BASELINE][1]
            alt = other(mode)
            t = {
                "target": f"{counts[-1]} hosts: slope per host <= raw mpirun's",
                "mode": mode,
                "figure": f"{ours:.3f} s/host against {raw:.3f} (hosts {','.join(map(str, counts))})",
                "met": ours <= raw,
            }
            if alt and alt in fits:
                t["other"] = f"{alt} {fits[alt][1]:.3f} s/host"
            out.append(t)
    pred = res.get("model", {}).get("predicted", {})

    def at(name: str, n: int) -> Optional[float]:
        by_n = pred.get(name, {})
        return by_n.get(n, by_n.get(str(n)))

    mode = TREE if tree_from is None or 1023 >= tree_from else FLAT  # auto's mode at 1,024 hosts
    alt = FLAT if mode == TREE else TREE
    ours, raw, theirs = at(mode, 1024), at("mpirun (raw, tree spawn)", 1024), at(alt, 1024)
    if ours and raw:
        out.append(
            {
                "target": "1,024 hosts in the model: <= 2x raw mpirun",
                "mode": mode,
                "figure": f"{ours / raw:.2f}x ({ours:.1f} s against {raw:.1f} s)",
                "met": ours / raw <= 2,
                **({"other": f"{alt} {theirs / raw:.2f}x"} if theirs else {}),
            }
        )
    return out


def _bullets(doc: str) -> list[str]:
    """The "- ..." items of a docstring, each joined onto one line. Pure."""
    items: list[str] = []
    for line in doc.splitlines():
        text = line.strip()
        if text.startswith("- "):
            items.append(text)
        elif items and text:
            items[-1] += " " + text
    return items


# ---------------------------------------------------------------------------------------------
# Output


def print_report(res: dict) -> None:
    counts = res["config"]["hosts"]
    launches = res["launches"]
    print(
        f"launch cost vs hosts: 1 rank per host running /bin/true, launcher on host 0, median of "
        f"{res['config']['repeats']} interleaved rounds, pre-flight included"
    )
    print(
        environment_line(res)
        + f"; load at start {res.get('load_average_at_start')}, at end {res.get('load_average_at_end')}"
    )
    py = res.get("python")
    if py:
        print(
            f"every launch's Python: {py['interpreter']} ("
            + ("the editable development install" if py["editable_finder"] else "laid out as a wheel install")
            + (", byte-compiled" if py.get("byte_compiled") else "")
            + ")"
        )
    names = list(launches)
    w = max(len(n) for n in names)
    print(f"\n{'configuration':<{w}}  " + "  ".join(f"{n:>6} h" for n in counts) + "   s/host  ratio@max")
    for name in names:
        cells = []
        for n in counts:
            e = launches[name][str(n)]
            cells.append(f"{e['median']:7.2f}s" if "median" in e else "  failed")
        fit = res["fits"].get(name)
        top = launches[name][str(counts[-1])]
        base = launches.get(BASELINE, {}).get(str(counts[-1]), {})
        ratio = f"{top['median'] / base['median']:.2f}x" if "median" in top and base.get("median") else "-"
        print(f"{name:<{w}}  " + "  ".join(cells) + (f"  {fit[1]:7.3f}" if fit else "        -") + f"  {ratio:>8}")
    print("\nratio to raw mpirun at each host count:")
    for name in names:
        if name == BASELINE:
            continue
        cells = []
        for n in counts:
            e, b = launches[name][str(n)], launches.get(BASELINE, {}).get(str(n), {})
            cells.append(f"{e['median'] / b['median']:6.2f}x" if "median" in e and b.get("median") else "     -")
        print(f"  {name:<{w}}  " + "  ".join(cells))
    if TREE in launches and FLAT in launches:
        faster = [
            n
            for n in counts
            if launches[TREE][str(n)].get("median", math.inf) < launches[FLAT][str(n)].get("median", 0)
        ]
        print(
            "\nmeasured here, the tree faster than flat at: "
            + (", ".join(map(str, faster)) + " hosts" if faster else "none of the host counts run")
        )
    mem = res.get("memory")
    if mem:
        print(
            f"\nmemory: the {mem['hosts']} hosts idle hold {mem['idle_pss_kib'] / 1024:.0f} MiB (PSS, "
            f"{mem['idle_pss_kib'] / mem['hosts']:.0f} KiB a host; RSS {mem['idle_rss_kib'] / 1024:.0f} MiB); MemAvailable "
            f"{mem['available_before_kib'] / 1024:.0f} MiB before the cluster, lowest during the launches "
            f"{mem['lowest_available_kib'] / 1024:.0f} MiB of {mem['total_kib'] / 1024:.0f} MiB"
        )
    if res.get("targets"):
        print(f"\ntargets (auto: tree from {res.get('tree_from_hosts')} remote hosts):")
        for t in res["targets"]:
            also = f" (beside it: {t['other']})" if t.get("other") else ""
            print(f"  {'MET    ' if t['met'] else 'NOT MET'} {t['target']}: {t['mode']} {t['figure']}{also}")
    if res.get("costs"):
        print("\nper-host costs and model (launch time in s at N hosts):")
        for line in res["model"]["assumptions"]:
            print("  " + line)
        for name, by_n in res["model"]["predicted"].items():
            print(f"  {name:<28} " + "  ".join(f"{n:>5} h: {t:6.2f} s" for n, t in by_n.items()))
        x = res["model"].get("crossover")
        print(
            f"  the tree is never slower than flat from {x} hosts on (model)"
            if x
            else "  the tree stays slower than flat up to 8,192 hosts (model)"
        )
    if res.get("plans"):
        print("\nplans at scale (mpirun backend, 8 ranks per host, --dry-run --json, median of 3):")
        for n, p in res["plans"].items():
            if "error" in p:
                print(f"  {n} hosts: FAILED {p['error']}")
            else:
                print(
                    f"  {n:>6} hosts: dry run {p['dry_run_s']:.2f} s; mpirun argv {p['argv_args']} arguments, "
                    f"{p['argv_bytes']} bytes, longest {p['longest_arg_bytes']} bytes (Linux limit 131072)"
                )
    if res.get("cpu_by_process"):
        print("\n" + "\n".join(cpu_table(res["cpu_by_process"])))


def markdown(res: dict) -> str:
    """docs/performance.md's tables for this result: the launches (median, ratio to raw mpirun, the
    least-squares slope), the model, the targets. Pure."""
    counts, launches = res["config"]["hosts"], res["launches"]
    names = list(launches)
    base = {n: launches.get(BASELINE, {}).get(str(n), {}).get("median") for n in counts}
    out = ["| hosts | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for n in counts:
        cells = []
        for name in names:
            m = launches[name][str(n)].get("median")
            if m is None:
                cells.append("failed")
            elif name != BASELINE and base[n]:
                cells.append(f"{m:.2f} ({m / base[n]:.2f}x)")
            else:
                cells.append(f"{m:.2f}")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    out.append(
        "| s/host (least squares) | "
        + " | ".join(f"{res['fits'][n][1]:.3f}" if n in res["fits"] else "-" for n in names)
        + " |"
    )
    model_ = res.get("model")
    if model_:
        pred = model_["predicted"]
        cols = list(pred)
        sizes = list(next(iter(pred.values())))
        out += ["", "| hosts | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for n in sizes:
            raw = pred["mpirun (raw, tree spawn)"][n]
            cells = [
                f"{pred[c][n]:.1f} s" + ("" if c.startswith("mpirun") else f" ({pred[c][n] / raw:.1f}x)") for c in cols
            ]
            out.append(f"| {int(n):,} | " + " | ".join(cells) + " |")
        out.append(f"\ncrossover (model): {model_.get('crossover')}")
    for t in res.get("targets", []):
        also = f" (beside it: {t['other']})" if t.get("other") else ""
        out.append(f"- {'met' if t['met'] else '**not met**'}: {t['target']}: {t['mode']} {t['figure']}{also}")
    return "\n".join(out)


def cpu_table(cpu: dict) -> list[str]:
    """The CPU-by-process table (seconds per launch, processes in brackets). Pure."""
    rows = cpu["rows"]
    out = [
        f"CPU per launch by process, {cpu['hosts']} hosts, {cpu['repeats']} launches each (process accounting):",
        "",
        "| process | " + " | ".join(rows) + " |",
        "|---" * (len(rows) + 1) + "|",
    ]
    for role in ACCT_ROLES:
        cells = [rows[r]["per_launch"][role] for r in rows]
        if any(c["cpu"] or c["processes"] for c in cells):
            out.append(f"| {role} | " + " | ".join(f"{c['cpu']:.2f} s ({c['processes']:.0f})" for c in cells) + " |")
    totals = [sum(c["cpu"] for c in rows[r]["per_launch"].values()) for r in rows]
    out.append(
        "| all | " + " | ".join(f"{t:.2f} s (wall {rows[r]['wall_median']:.2f} s)" for t, r in zip(totals, rows)) + " |"
    )
    return out


def tree_from_hosts() -> Optional[int]:
    """auto's threshold for the tree this bench runs (one pass where the checkout has it; plan/fanoutmode.py),
    None before issue 34."""
    try:
        from gaudi_launch.plan import fanoutmode
    except ImportError:
        return None
    return getattr(fanoutmode, "ONE_PASS_FROM_HOSTS", None) or fanoutmode.TREE_FROM_HOSTS


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="16,32,64", help="host counts, comma-separated (default 16,32,64)")
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1)
    p.add_argument("--all-rows", action="store_true", help="also the older rows (--check-only, no sharing, ...)")
    p.add_argument(
        "--deepspeed", action="store_true", help="with --all-rows: gaudi-launch --backend deepspeed, raw DeepSpeed"
    )
    p.add_argument("--no-plans", action="store_true", help="skip the 1,000/10,000-host dry runs")
    p.add_argument(
        "--tree-sweep",
        choices=("ssh", "tree", "none"),
        default="tree",
        help="how the tree path's end-of-job sweep reaches the hosts, for the model (default tree: one more mpirun "
        "through the daemon tree, backends/mpirun.tree_sweeper; ssh: a session per host, as before it)",
    )
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no measured round that would end past this many minutes of launches (the medians are of the "
        "rounds run; at least one)",
    )
    p.add_argument(
        "--dev-python",
        action="store_true",
        help="run every launch with this interpreter (the editable development install) instead of a venv laid out "
        "as a wheel install (installed_python)",
    )
    p.add_argument(
        "--cpu-by-process",
        type=int,
        default=0,
        metavar="N",
        help="also the CPU of one pass and raw mpirun at N hosts by process, under the kernel's process accounting "
        "(root, Debian's acct; --repeats launches each)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", action="store_true", help="also print the tables as docs/performance.md has them")
    p.add_argument("--from-json", default=None, help="print the report of an earlier run's --json, run nothing")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
        print_report(res)
        if args.markdown:
            print("\n" + markdown(res))
        return 0
    counts = sorted({int(x) for x in args.hosts.split(",")})
    if not counts or counts[0] < 1 or counts[-1] > 200:
        p.error("--hosts: counts from 1 to 200 (the namespace cluster's most)")
    if args.cpu_by_process and not (1 <= args.cpu_by_process <= counts[-1] and shutil.which("accton")):
        p.error("--cpu-by-process N: N from 1 to the most --hosts, and accton on PATH (apt-get install acct)")

    from tests.cluster.netcluster import NetCluster

    global PYTHON
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("DS_ACCELERATOR", "cpu")
    res: dict = {
        "bench": "scale",
        **environment(),
        "config": {"hosts": counts, "repeats": args.repeats, "deepspeed": args.deepspeed, "all_rows": args.all_rows},
        "tree_from_hosts": tree_from_hosts(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
        if not args.dev_python:
            PYTHON = installed_python(workdir)
            env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env["PATH"]
        res["python"] = {
            "interpreter": PYTHON,
            "editable_finder": args.dev_python,
            "byte_compiled": byte_compile_package(),  # as pip's install does (PYTHONDONTWRITEBYTECODE otherwise)
        }
        cfgs = configs(args.deepspeed, args.all_rows)
        with open(os.path.join(workdir, "noop.py"), "w") as f:
            f.write("pass\n")
        if not args.no_plans:
            print("plans at scale ...", file=sys.stderr, flush=True)
            res["plans"] = plan_scale(workdir, env)
        available_before = MemoryWatch.available_kib()
        cluster = NetCluster(counts[-1], os.path.join(workdir, "cluster"), prefix=PREFIX, subnet_octet=OCTET)
        cluster.up()
        try:
            idle = cluster.memory_kib()
            cenv = cluster.env(env)
            budget = args.max_minutes * 60 if args.max_minutes else None
            with MemoryWatch() as watch:
                launches = measure(
                    cluster, counts, args.repeats, args.warmup_rounds, cfgs, workdir, cenv, args.timeout, budget
                )
            with open("/proc/meminfo") as f:
                total = int(f.readline().split()[1])
            res["memory"] = {
                "hosts": cluster.n,
                "idle_pss_kib": idle["pss"],
                "idle_rss_kib": idle["rss"],
                "available_before_kib": available_before,
                "lowest_available_kib": watch.lowest_kib,
                "total_kib": total,
            }
            res["launches"] = {name: {str(n): e for n, e in per.items()} for name, per in launches.items()}
            done = max((len(e["seconds"]) for per in launches.values() for e in per.values()), default=0)
            res["config"]["repeats_asked"], res["config"]["repeats"] = args.repeats, done
            fits = {}
            for name, per in launches.items():
                pts = [(n, e["median"]) for n, e in per.items() if "median" in e]
                s = slope(pts)
                if s is not None:
                    intercept = statistics.fmean(y for _, y in pts) - s * statistics.fmean(x for x, _ in pts)
                    fits[name] = (intercept, s)
            res["fits"] = fits
            if args.cpu_by_process:
                print("CPU by process ...", file=sys.stderr, flush=True)
                res["cpu_by_process"] = cpu_by_process(
                    cluster, cfgs, args.cpu_by_process, args.repeats, workdir, cenv, args.timeout
                )
            if counts[-1] >= 2:
                print("per-host costs and one level of the tree ...", file=sys.stderr, flush=True)
                res["costs"] = per_host_costs(cluster, cenv, workdir)
                res["tree_level"] = tree_level(cluster, cenv, workdir)
                res["costs"]["tree_level"] = res["tree_level"]["per_level"]
                res["costs"].update(fixed_parts(cluster, cenv, workdir))
                res["gate"] = gate_cost()
                res["costs"]["gate_connection_local_cpu"] = res["gate"]["per_connection_cpu"]
                lines, predicted, crossover = model(res["costs"], fits, tree_sweep=args.tree_sweep)
                res["model"] = {
                    "assumptions": lines + _bullets(model.__doc__),
                    "predicted": predicted,
                    "crossover": crossover,
                }
        finally:
            cluster.down()
    try:
        res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    res["targets"] = targets(res, res["tree_from_hosts"])
    print_report(res)
    if args.markdown:
        print("\n" + markdown(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
        print(f"wrote {args.json}")
    failed = any("error" in e for per in res["launches"].values() for e in per.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
