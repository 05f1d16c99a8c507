"""``--fan-out tree`` in one pass (issue 34): the pre-flight and the end sweep ride the job's own mpirun.

The three-pass tree runs three mpiruns down OpenMPI's daemon tree: the probe (treeprobe.py), the job, the
sweep (backends/mpirun.tree_sweeper). Here the job's mpirun is the only one when all goes well:

- the plan is made without the hosts' facts (``deferring``: the pre-flight is left to the job);
- every rank's bootstrap connects back to a listener of the launcher's (``GateServer``), the channel the
  daemons' own callbacks already use (each orted connects to mpirun's host over TCP); the first rank of each
  host first runs the pre-flight's probe there (process/gate.py) and sends its output;
- the launcher judges those outputs with the pre-flight's own code (hostchecks.run_preflight with the outputs
  as the tree's answers: the same classification, table and fix text) and answers every rank: go, with the
  variables the facts add to the plan (``facts_env``), or stop (the ranks exit 3 before anything of the user's
  ran; the launcher raises the pre-flight's failure with its table);
- mpirun's ssh is our tree hop (treehop.py), so a host that is dead or hangs at any depth is named from mpirun's
  error output; OpenMPI 4 then starts no rank at all, and the table is completed by the three-pass tree's probe
  of the other hosts (one more pass, on failure only; the hanging host is not tried again);
- at its end the last rank of each host sweeps the job's leftovers there and says so; the launcher's sweep
  (through the tree) then covers only the hosts that did not.

What the launcher cannot do in one pass falls back to the three-pass tree (``applies``): spare hosts (not in the
job's mpirun), --check-only and dry runs (no job), --wait-hosts and the collective check (both want the
pre-flight before the job), OpenMPI 5, a user's own rsh agent. GAUDI_LAUNCH_TREE_PASSES=3
asks for the three-pass tree.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from typing import Callable, Optional

from gaudi_launch.inputs.hostnames import bare_host, is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import fanoutmode
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.multinode import apply_facts
from gaudi_launch.plan.planner import gaudi_settings
from gaudi_launch.plan.shared import fabric_settings
from gaudi_launch.remote import gatewire
from gaudi_launch.remote.hostchecks import fan_out
from gaudi_launch.remote.preflight import CheckReport
from gaudi_launch.wire import HOST_CARDS


def applies(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str] = os.environ) -> bool:
    """The job goes through the tree in one pass: it can (fanoutmode.one_pass_possible) and goes by the tree."""
    if not fanoutmode.one_pass_possible(plan, spec, environ):
        return False
    return fan_out(plan, spec, len({n.host for n in plan.nodes if not is_local_host(n.host)}), environ) == "tree"


def deferring(preflight: Callable) -> Callable:
    """The pre-flight, left to the job's own ranks where the job goes through the tree in one pass: an empty
    report then (the plan is made without the hosts' facts; the backend runs the checks)."""

    def run(plan: LaunchPlan, spec: JobSpec):
        if applies(plan, spec):
            return CheckReport(facts={})
        return preflight(plan, spec)

    return run


def deferred(plan: LaunchPlan) -> bool:
    """The plan's pre-flight was left to the job (``deferring``'s empty report). Pure."""
    return plan.preflight is not None and not plan.preflight.get("hosts")


# ---------------------------------------------------------------- the listener


class GateServer:
    """The launcher's end of the gate: every rank's hello (the first rank of each host with its probe's
    output), the verdict to each, then each host's "swept" at the job's end. One thread, one selector."""

    def __init__(self, plan: LaunchPlan, bind_addr: str = ""):
        self.key = secrets.token_bytes(32)
        self.rank_host = {r: n.host for n in plan.nodes for r in n.ranks}
        self.first_rank = {n.ranks[0]: n.host for n in plan.nodes}
        self.outputs: dict[str, str] = {}  # host -> its probe's output (first rank's)
        self.hello_hosts: set[str] = set()
        self.swept: dict[str, int] = {}
        self._verdict: Optional[tuple[bool, dict]] = None
        self._conns: dict[socket.socket, dict] = {}
        self._cond = threading.Condition()
        _raise_fd_limit(len(self.rank_host) + 64)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind_addr, 0))
        self.sock.listen(1024)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="gaudi-launch-gate", daemon=True)
        self._thread.start()

    # -- the launcher's side
    def wait_reports(self, hosts: list[str], done: Callable[[], bool], deadline: float) -> None:
        """Until every host in ``hosts`` sent its probe, ``done()`` (mpirun ended) or ``deadline``."""
        with self._cond:
            while not all(h in self.outputs for h in hosts) and not done() and time.monotonic() < deadline:
                self._cond.wait(0.1)

    def decide(self, go: bool, env: Optional[Mapping[str, Mapping[str, str]]] = None) -> None:
        """The verdict for every rank: go with ``env`` (host -> its ranks' variables, per_host), or stop."""
        with self._cond:
            self._verdict = (go, {h: dict(e) for h, e in (env or {}).items()})
        self._wake_w.send(b"v")

    def wait_closed(self, timeout: float) -> None:
        """Until every rank's connection ended (their "swept" read), at most ``timeout`` s."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._conns and time.monotonic() < end:
                self._cond.wait(0.05)

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(2.0)
        for s in [self.sock, self._wake_r, self._wake_w, *self._conns]:
            try:
                s.close()
            except OSError:
                pass

    # -- the thread
    def _loop(self) -> None:
        while not self._stop:
            for k, _ in self._sel.select(1.0):
                if k.data is None:
                    self._accept()
                elif k.data == "wake":
                    try:
                        self._wake_r.recv(64)
                    except OSError:
                        pass
                    self._answer_all()
                else:
                    self._read(k.fileobj)

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.setblocking(False)
        with self._cond:
            self._conns[conn] = {"buf": b"", "nonce": None, "answered": False, "t0": time.monotonic()}
        self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _drop(self, conn: socket.socket) -> None:
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        with self._cond:
            self._conns.pop(conn, None)
            self._cond.notify_all()

    def _read(self, conn) -> None:
        st = self._conns.get(conn)
        try:
            chunk = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk or st is None:
            self._drop(conn)
            return
        st["buf"] += chunk
        if len(st["buf"]) > gatewire.MAX_LINE:
            self._drop(conn)
            return
        while b"\n" in st["buf"]:
            line, st["buf"] = st["buf"].split(b"\n", 1)
            if st["nonce"] is None:
                body = gatewire.read_hello(self.key, line)
                if body is None:  # not one of our ranks: nothing said back
                    self._drop(conn)
                    return
                st["nonce"], st["rank"] = body["nonce"], body.get("rank")
                rank = int(body["rank"]) if str(body.get("rank", "")).isdigit() else -1
                with self._cond:
                    if rank in self.rank_host:
                        self.hello_hosts.add(self.rank_host[rank])
                    if rank in self.first_rank and isinstance(body.get("probe"), str):
                        self.outputs[self.first_rank[rank]] = body["probe"]
                    self._cond.notify_all()
                self._answer(conn)
            else:
                found = gatewire.read_swept(self.key, st["nonce"], line)
                rank = int(st["rank"]) if str(st.get("rank", "")).isdigit() else -1
                if found is not None and rank in self.rank_host:
                    with self._cond:
                        self.swept[self.rank_host[rank]] = int(found.get("hit", 0))

    def _answer(self, conn) -> None:
        st = self._conns.get(conn)
        if st is None or st["answered"] or st["nonce"] is None or self._verdict is None:
            return
        go, by_host = self._verdict
        rank = int(st["rank"]) if str(st.get("rank", "")).isdigit() else -1
        env = by_host.get(self.rank_host.get(rank, ""), {}) if go else {}
        st["answered"] = True
        try:
            conn.setblocking(True)
            conn.settimeout(10.0)
            conn.sendall(gatewire.verdict(self.key, st["nonce"], go, env))
            conn.setblocking(False)
        except OSError:
            self._drop(conn)

    def _answer_all(self) -> None:
        for conn in list(self._conns):
            self._answer(conn)


def _raise_fd_limit(wanted: int) -> None:
    """One connection per rank while the job runs: the soft limit on open files up to the hard one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted, hard)
            )
    except (ValueError, OSError):
        pass


def is_ip(text: str) -> bool:
    """An IPv4 address (what gate_address finds on a route; a name otherwise). Pure."""
    try:
        socket.inet_aton(text)
    except OSError:
        return False
    return text.count(".") == 3


def gate_address(plan: LaunchPlan) -> str:
    """This host's address as the hosts reach it: the source of the route to the first remote host (what
    mpirun's daemons call back to), else this host's name. Pure but for the route lookup."""
    for n in plan.nodes:
        if is_local_host(n.host):
            continue
        try:  # a UDP socket's connect picks the route and sends nothing (as process/worker.route_source)
            family, _, _, _, addr = socket.getaddrinfo(bare_host(n.host).rpartition("@")[2], 9, type=socket.SOCK_DGRAM)[
                0
            ]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                return str(s.getsockname()[0])
        except (OSError, IndexError):
            continue
    return socket.getfqdn()


# ---------------------------------------------------------------- the facts' variables


def facts_env(plan: LaunchPlan, spec: JobSpec, facts: Mapping, environ: Mapping[str, str]) -> tuple[dict, LaunchPlan]:
    """The variables the hosts' facts add to a plan made without them (planner.assemble's steps that read the
    facts: the interface and its network, the scale-out settings, the cards each rank binds from), and that
    plan. Pure."""
    full = copy.deepcopy(plan)
    before = dict(plan.env)
    apply_facts(full, facts, environ)
    fabric_settings(full, spec, environ, facts=facts)
    gaudi_settings(full, spec, environ, facts)
    env = {k: v for k, v in full.env.items() if before.get(k) != v}
    if full.tcp_cidr and full.tcp_cidr != plan.tcp_cidr:  # the ranks' MPI library (the daemons are up already)
        env["OMPI_MCA_btl_tcp_if_include"] = full.tcp_cidr
    return env, full


def per_host(env: Mapping[str, str], hostnames: Mapping[str, Optional[str]]) -> dict[str, dict[str, str]]:
    """Each host's share of ``env`` (facts_env's): HOST_CARDS cut down to the entry of that host's own hostname
    (what its ranks read), not every host's cards to every rank (about 40 KB at 1,000 hosts, to each of 8,000
    ranks); the rest alike. ``hostnames``: host -> its probe's hostname. Pure."""
    common = {k: v for k, v in env.items() if k != HOST_CARDS}
    if HOST_CARDS not in env:
        return {h: common for h in hostnames}
    try:
        layouts = json.loads(env[HOST_CARDS])["layouts"]
    except (ValueError, KeyError, TypeError):
        return {h: dict(env) for h in hostnames}
    out = {}
    for host, name in hostnames.items():
        mine = [[cards, cpus, [name]] for cards, cpus, names in layouts if name in names]
        out[host] = {**common, HOST_CARDS: json.dumps({"layouts": mine}, separators=(",", ":"))} if mine else common
    return out


class HeldStream:
    """The supervisor's output stream, held until the verdict: before it nothing of the user's can be written
    (no script started), only mpirun's own messages and the supervisor's summary of ranks told to stop, which
    the pre-flight's table replaces. ``release(True)`` writes what was held and lets the rest through."""

    def __init__(self, inner):
        self._inner, self._held, self._lock, self._open = inner, [], threading.Lock(), False

    def write(self, text: str) -> int:
        with self._lock:
            if not self._open:
                self._held.append(text)
                return len(text)
        return self._inner.write(text)

    def flush(self) -> None:
        with self._lock:
            if not self._open:
                return
        self._inner.flush()

    def release(self, emit: bool) -> None:
        with self._lock:
            held, self._held, self._open = self._held, [], True
        if emit and held:
            self._inner.write("".join(held))
            self._inner.flush()

    def __getattr__(self, name):
        return getattr(self._inner, name)
