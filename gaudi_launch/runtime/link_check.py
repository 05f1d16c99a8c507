"""One host's agent in the collective check: hosts paired in rounds, each pair bounded by its own deadline.

The launcher starts this module through the job's own backend, one agent per host. It imports no torch
(torch's import is about 1.1 s of CPU a process), and every wait of its own is a socket with a deadline, so
it is the part of the check that can be trusted to come back. Rank 0 also runs the coordinator.

1. Rendezvous at MASTER_ADDR:MASTER_PORT, served by rank 0. Only the check's own agents may join: each
   proves it holds the check's token (GAUDI_LAUNCH_COLLECTIVE_TOKEN, a random value the launcher ships as a
   job variable, never on a command line) by an HMAC over the coordinator's fresh nonce; the coordinator
   proves the same over the agent's nonce in its answer. A rank out of range, taken twice, a wrong MAC or
   junk closes that connection alone (it is reported, the check goes on).
2. Stage "tcp" (torch-free): the pairs of pairrounds.py's schedule exchange SIZE bytes LOOPS times
   both ways at once over TCP on the interface the agent reaches the master on (the job's); rounds go on
   until every host with a bad pair is told apart (pinned) or cleared. On a CPU gloo's transport is such
   TCP connections: this stage is the verdict.
3. When a rank's device is a Gaudi or a GPU (or GAUDI_LAUNCH_COLLECTIVE_LIBRARY=1): stage "library", the
   same schedule over the hosts the TCP stage did not name, each pair a small job of its own: on each of
   the two hosts one process per card (runtime/collective_check.py, hccl on Gaudi), started here and
   killed here with its process group when the pair's deadline passes. The bridge's HCCL waits never
   time out (gaudi-pytorch-bridge, ProcessGroupHCCL.cpp WorkHCCL::wait: "abort API is not implemented"),
   so the deadline must be kept from outside the process that hangs. Then one short all-reduce of every
   host left confirms them together.
The coordinator prints one record per pair (MARKER + JSON), which the launcher judges
(reports/collective.py); it knows a pair's result even when one of its agents went silent.
"""

from __future__ import annotations

import hmac
import importlib.util
import json
import os
import queue
import re
import secrets
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

from gaudi_launch import pairrounds
from gaudi_launch.wire import COLLECTIVE, COLLECTIVE_LIBRARY, COLLECTIVE_MARKER, COLLECTIVE_TOKEN, DEVICE

LIBRARY_MODULE = "gaudi_launch.runtime.collective_check"
LATENCY_ROUNDS = 10
CHUNK = 64 << 10  # one recv at most: the first piece's arrival starts a large message's clock
MAX_LINE = 1 << 16  # a control line longer than this is junk
MARGIN_S = pairrounds.MARGIN_S
RETRY = 1000  # a slow pair's second measurement goes as round RETRY + k (its connections are told apart)
# Defaults when the launcher sends none (runtime tests): see collective.py for the launcher's.
DEFAULTS = {
    "cards": 1,
    "bytes": 4 << 20,
    "loops": 5,
    "lib_bytes": 32 << 20,
    "lib_loops": 1000,
    "confirm_loops": 10,
    # The job's processes per host ("cards"), and per rank (str) where a host differs: {"cards", "env": its
    # card visibility}; sparse, so that a variable of a thousand hosts stays far under Linux's 128 KB a string.
    "nodes": {},
    "pair_timeout": 10.0,
    "lib_timeout": 130.0,
    "join_timeout": 60.0,
}


class PeerTimeout(RuntimeError):
    """Another process did not answer in time (the judge reads "timed out": not this host's fault)."""


class Refused(ValueError):
    """A control or pair connection that is not the check's: closed, never trusted."""


def say(record: dict) -> None:
    print(COLLECTIVE_MARKER + json.dumps(record, sort_keys=True), flush=True)


def settings(environ) -> dict:
    """The check's settings (JSON in GAUDI_LAUNCH_COLLECTIVE), over DEFAULTS."""
    raw = environ.get(COLLECTIVE, "")
    data = json.loads(raw) if raw.startswith("{") else {}
    return {**DEFAULTS, **{k: v for k, v in data.items() if k in DEFAULTS}}


def mac(token: bytes, *parts) -> str:
    return hmac.new(token, "\n".join(map(str, parts)).encode(), "sha256").hexdigest()


def device_kind(environ, find_spec=importlib.util.find_spec, exists=os.path.exists) -> str:
    """The device runtime/device.select_device will pick, told without importing torch: --device, else a
    Gaudi bridge, else a GPU when torch is a CUDA or ROCm build and the driver is there, else the CPU."""
    forced = environ.get(DEVICE)
    if forced:
        return forced
    if find_spec("habana_frameworks") is not None:
        return "hpu"
    spec = find_spec("torch")
    if spec is not None and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                text = f.read()
        except OSError:
            return "cuda"  # cannot tell: the library stage decides
        built = {m.group(1) for m in re.finditer(r"^(cuda|hip)\b[^=\n]*=\s*['\"]", text, re.M)}
        if ("cuda" in built and exists("/proc/driver/nvidia/version")) or ("hip" in built and exists("/dev/kfd")):
            return "cuda"
    return "cpu"


def card_name(run=subprocess.run) -> Optional[str]:
    """hl-smi's name of this host's first card (HL-325L: a Gaudi 3), or None. Bounded; never raises."""
    try:
        done = run(["hl-smi", "-Q", "name", "-f", "csv,noheader"], capture_output=True, text=True, timeout=10)
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
        return lines[0] if lines else None
    except Exception:  # no hl-smi, a hang, odd output: not known
        return None


def own_address(sock: socket.socket) -> tuple[str, int]:
    """(address, family) this end of ``sock`` has. A v4-mapped IPv6 address (MASTER_ADDR resolved to
    ::ffff:a.b.c.d, as the test clusters' hosts files offer) is its IPv4 address: binding a listener to the
    mapped form fails (EINVAL), and a peer dials the plain one all the same."""
    addr = sock.getsockname()[0]
    if sock.family == socket.AF_INET6 and addr.lower().startswith("::ffff:") and "." in addr:
        return addr[7:], socket.AF_INET
    return addr, sock.family


def cards_of(cfg: dict, rank: int) -> int:
    """The job's processes on rank ``rank``'s host (settings "nodes", else "cards"), 1 when not said."""
    return max(1, int(node_of(cfg, rank).get("cards", cfg.get("cards", 1))))


def node_of(cfg: dict, rank: int) -> dict:
    """What the settings say of rank ``rank``'s host alone ({} when it is like the others)."""
    nodes = cfg.get("nodes")
    node = nodes.get(str(rank)) if isinstance(nodes, dict) else None
    return node if isinstance(node, dict) else {}


def free_port(addr: str, family) -> int:
    """A port free now on ``addr``, for the next library job's store (its side 0 binds it next)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Line:
    """Lines of JSON over one socket, each read against a deadline and capped in length."""

    def __init__(self, sock: socket.socket):
        self.sock, self.f = sock, sock.makefile("rb")

    def read(self, deadline: float, what: str):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            line = self.f.readline(MAX_LINE)
        except socket.timeout:
            raise PeerTimeout(f"timed out waiting for {what}") from None
        except OSError as exc:
            raise PeerTimeout(f"connection reset waiting for {what}: {exc}") from None
        if not line:
            raise PeerTimeout(f"connection closed waiting for {what}")
        if not line.endswith(b"\n"):
            raise Refused(f"a line over {MAX_LINE} bytes from {what}")
        try:
            data = json.loads(line)
        except ValueError:
            raise Refused(f"not JSON from {what}") from None
        if not isinstance(data, dict):
            raise Refused(f"not a JSON object from {what}")
        return data

    def send(self, data: dict) -> None:
        self.sock.sendall((json.dumps(data, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        for part in (self.f, self.sock):
            try:
                part.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------------
# The coordinator (rank 0)


def check_hello(hello: dict, nonce: str, token: bytes, world: int, joined) -> int:
    """The rank a hello proves, or Refused saying why. Pure."""
    rank = hello.get("rank")
    if type(rank) is not int or not 0 <= rank < world:
        raise Refused(f"rank {rank!r} is not one of 0..{world - 1}")
    fields = [hello.get(k) for k in ("addr", "port", "lport", "kind", "nonce")]
    if not (isinstance(fields[0], str) and all(type(p) is int and 0 < p < 65536 for p in fields[1:3])):
        raise Refused("a hello without an address and ports")
    if not (isinstance(fields[3], str) and isinstance(fields[4], str)):
        raise Refused("a hello without a device kind and nonce")
    if not hmac.compare_digest(str(hello.get("mac", "")), mac(token, "hello", nonce, rank, *fields)):
        raise Refused(f"a hello as rank {rank} without the check's token")
    if rank in joined:
        raise Refused(f"rank {rank} joined already")
    return rank


class Coordinator:
    """Rank 0's rendezvous and rounds, in a thread of its own."""

    def __init__(self, port: int, world: int, cfg: dict, token: bytes, library: bool = False):
        self.world, self.cfg, self.token, self.library = world, cfg, token, library
        if socket.has_dualstack_ipv6():  # MASTER_ADDR may resolve to either family
            self.sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self.sock = socket.create_server(("", port))
        self.conns: dict[int, Line] = {}
        self.faulty = False  # a bad pair or a missing agent: rank 0 then exits non-zero, so that the job's
        # backend tears down an agent that went silent instead of waiting for it
        self.hellos: dict[int, dict] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name="link-check-coordinator", daemon=True)
        self.thread.start()

    # ---- rendezvous
    def _greet(self, conn: socket.socket, peer) -> None:
        """One connection's hello, in a thread of its own: a client that sends nothing delays nobody."""
        line = Line(conn)
        try:
            nonce = secrets.token_hex(16)
            line.send({"nonce": nonce})
            hello = line.read(time.monotonic() + self.cfg["pair_timeout"], "a hello")
            with self.lock:
                rank = check_hello(hello, nonce, self.token, self.world, self.hellos)
                self.hellos[rank], self.conns[rank] = hello, line
        except Exception as exc:  # every connection's own fault stays its own: junk never stops the check
            say({"step": "refused", "rank": 0, "from": str(peer[0]), "why": f"{type(exc).__name__}: {exc}"[:300]})
            line.close()

    def _rendezvous(self) -> bool:
        deadline = time.monotonic() + self.cfg["join_timeout"]
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.hellos) == self.world:
                    break
            self.sock.settimeout(0.2)
            try:
                conn, peer = self.sock.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self._greet, args=(conn, peer), daemon=True).start()
        with self.lock:
            missing = [r for r in range(self.world) if r not in self.hellos]
            if missing:
                self.faulty = True
                say({"step": "rendezvous", "rank": 0, "missing": missing})
                for c in self.conns.values():
                    c.send({"cmd": "abort", "why": f"no hello from rank(s) {','.join(map(str, missing))}"})
                return False
        self.library = self.library or any(h["kind"] != "cpu" for h in self.hellos.values())
        peers = [[self.hellos[r]["addr"], self.hellos[r]["port"]] for r in range(self.world)]
        for r, c in self.conns.items():
            proof = mac(self.token, "table", self.hellos[r]["nonce"], json.dumps(peers), self.library)
            c.send({"peers": peers, "library": self.library, "mac": proof})
        self.lport = {r: self.hellos[r]["lport"] for r in range(self.world)}
        return True

    # ---- rounds
    def _round(self, stage: str, k: int, pairs: list, deadline_s: float, group: Optional[list] = None) -> dict:
        """Send every rank its part of round k; {rank: its result ({} when none came by the deadline)}."""
        role = {}
        for a, b in pairs:
            master = [self.hellos[a]["addr"], self.lport[a]]
            cards = [cards_of(self.cfg, a), cards_of(self.cfg, b)]
            role[a] = {"partner": b, "side": 0, "master": master, "cards": cards}
            role[b] = {"partner": a, "side": 1, "master": master, "cards": cards}
        if group is not None:  # the confirm: every rank of the group, one job
            master = [self.hellos[group[0]]["addr"], self.lport[group[0]]]
            cards = [cards_of(self.cfg, r) for r in group]
            role = {r: {"group": group, "master": master, "cards": cards} for r in group}
        early: dict[int, dict] = {}
        if stage != "tcp" and role:
            # first every agent's card processes started (torch imported, the card taken), then the jobs'
            # clocks start together: a partner still starting must not eat into the other's deadline
            prepare = {r: {"cmd": "prepare", "round": k, "cards": role[r]["cards"]} for r in role}
            ready = self._ask(k, prepare, self.cfg["join_timeout"])
            late = {r for r in role if not ready.get(r, {}).get("ok")}
            for r in late:
                early[r] = {
                    "ok": False,
                    "error": (ready.get(r) or {}).get("error") or "no answer while its card processes started",
                }
            for r in role:
                if r not in late and (group is not None and late or role[r].get("partner") in late):
                    early[r] = {"ok": True}  # its part was fine: the job could not run for the other's
            role = {r: v for r, v in role.items() if r not in early}
        msgs = {r: {"cmd": "pair", "stage": stage, "round": k, **role.get(r, {"partner": None})} for r in self.conns}
        results = self._ask(k, msgs, deadline_s)
        return {**{r: results.get(r, {}) for r in role}, **early}

    def _ask(self, k: int, msgs: dict, wait_s: float) -> dict:
        """Send each rank its message of round k; {rank: its answer} for those that answered in time."""
        alive = {}
        for r, msg in msgs.items():
            try:
                self.conns[r].send(msg)
                alive[r] = self.conns[r]
            except (OSError, KeyError):
                pass
        results: dict[int, dict] = {}
        deadline = time.monotonic() + wait_s + MARGIN_S
        for r, c in alive.items():
            try:
                res = c.read(deadline, f"rank {r}'s result")
                if res.get("round") == k:
                    results[r] = res
                    if type(res.get("lport")) is int:
                        self.lport[r] = res["lport"]
            except (PeerTimeout, Refused):
                pass
        return results

    def _stage(self, stage: str, ranks: list[int], deadline_s: float) -> set:
        """The rounds of one stage over ``ranks``; the ranks it names. A pair slow in its round is measured
        once more at once and keeps its better figure: a link really slow is slow every time, a pair that
        met a busy CPU is not (a failed pair is not retried: a hang is no noise, and costs a deadline)."""
        schedule = pairrounds.round_robin(len(ranks))
        pairs: list[pairrounds.Pair] = []
        v = pairrounds.verdict(ranks, [])
        for k, rnd in enumerate(schedule[: pairrounds.max_rounds(len(ranks))]):
            mapped = [(ranks[a], ranks[b]) for a, b in rnd]
            got = self._round(stage, k, mapped, deadline_s)
            mine = [pairrounds.pair_of(got.get(a, {}), got.get(b, {}), k, a, b) for a, b in mapped]
            pairrounds.classify(pairs + mine)
            slow = [p for p in mine if p.ok and p.slow]
            if slow:
                again = self._round(stage, RETRY + k, [(p.a, p.b) for p in slow], deadline_s)
                for p in slow:
                    q = pairrounds.pair_of(again.get(p.a, {}), again.get(p.b, {}), k, p.a, p.b)
                    if q.ok and (q.gbs or 0) > (p.gbs or 0):
                        p.gbs, p.latency_s = q.gbs, q.latency_s
                        got[p.a] = {**got.get(p.a, {}), **again.get(p.a, {})}
            for p in mine:
                pairs.append(p)
                side = got.get(p.a, {})
                record = {k2: v2 for k2, v2 in p.__dict__.items() if k2 != "slow"}  # the judge decides that
                say(
                    {
                        "step": "pair",
                        "stage": stage,
                        "rank": 0,
                        **record,
                        "ranks": side.get("ranks"),
                        "backend": side.get("backend"),
                    }
                )
            v = pairrounds.verdict(ranks, pairs)
            self.faulty |= any(not p.ok for p in pairs)  # a silent agent: the backend must end it
            if pairrounds.settled(v, k + 1, len(ranks)):
                break
        return v.named

    def _serve(self) -> None:
        try:
            if not self._rendezvous():
                return
            self.ranks = list(range(self.world))
            cfg = self.cfg
            named = self._stage("tcp", self.ranks, cfg["pair_timeout"])
            if self.library:
                lib_wait = cfg["lib_timeout"]
                left = [r for r in self.ranks if r not in named]
                named |= self._stage("library", left, lib_wait) if len(left) > 1 else set()
                left = [r for r in self.ranks if r not in named]
                if len(left) > 2:  # two hosts left: their pair was the whole cluster
                    got = self._round("confirm", 0, [], lib_wait, group=left)
                    bad = {r: g for r, g in got.items() if not g.get("ok")}
                    self.faulty |= bool(bad)
                    first = got.get(left[0], {})
                    say(
                        {
                            "step": "confirm",
                            "rank": 0,
                            "members": left,
                            "ok": not bad,
                            "gbs": first.get("gbs") if not bad else None,
                            "algbw": first.get("algbw") if not bad else None,
                            "seconds": first.get("seconds") if not bad else None,
                            "bytes": first.get("bytes"),
                            "ranks": first.get("ranks"),
                            "backend": first.get("backend"),
                            "reason": "; ".join(f"rank {r}: {g.get('error') or 'no result'}" for r, g in bad.items()),
                        }
                    )
            for c in self.conns.values():
                try:
                    c.send({"cmd": "end"})
                except OSError:
                    pass
        except Exception as exc:
            self.faulty = True
            say({"step": "coordinator", "rank": 0, "error": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            time.sleep(0.2)  # let the agents read "end" before their connections close
            for c in self.conns.values():
                c.close()
            self.sock.close()


# ---------------------------------------------------------------------------------------------------------
# An agent (every rank, rank 0 too)


class Agent:
    def __init__(self, rank: int, world: int, master: tuple[str, int], cfg: dict, token: bytes):
        self.rank, self.world, self.cfg, self.token = rank, world, cfg, token
        deadline = time.monotonic() + cfg["join_timeout"]
        while True:  # rank 0's coordinator may not listen yet
            try:
                sock = socket.create_connection(master, timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise PeerTimeout(f"timed out connecting to the rendezvous at {master[0]}:{master[1]}") from None
                time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.coord = Line(sock)
        self.addr, self.family = own_address(sock)  # the interface this host reaches the master on: the job's
        self.listener = socket.create_server((self.addr, 0), family=self.family)
        self.port = self.listener.getsockname()[1]
        self.deadline_pad = cfg["lib_timeout"] + cfg["join_timeout"] + 2 * MARGIN_S
        self.workers: Optional[Workers] = None

    def rendezvous(self, kind: str) -> dict:
        greet = self.coord.read(time.monotonic() + self.cfg["join_timeout"], "the coordinator's greeting")
        nonce = secrets.token_hex(16)
        fields = [self.addr, self.port, free_port(self.addr, self.family), kind, nonce]
        hello = dict(zip(("addr", "port", "lport", "kind", "nonce"), fields), rank=self.rank)
        hello["mac"] = mac(self.token, "hello", str(greet.get("nonce")), self.rank, *fields)
        self.coord.send(hello)
        table = self.coord.read(time.monotonic() + self.cfg["join_timeout"] + MARGIN_S, "the rendezvous")
        if table.get("cmd") == "abort":
            raise PeerTimeout(f"timed out at the rendezvous: {table.get('why')}")
        peers, library = table.get("peers"), table.get("library")
        expect = mac(self.token, "table", nonce, json.dumps(peers), library)
        if not hmac.compare_digest(str(table.get("mac", "")), expect):
            raise Refused("the rendezvous at MASTER_ADDR:MASTER_PORT answered without the check's token")
        self.peers = peers
        return table

    def serve(self, host: str) -> None:
        """Each command of the coordinator, until "end"."""
        while True:
            cmd = self.coord.read(time.monotonic() + self.deadline_pad, "the coordinator's next round")
            if cmd.get("cmd") == "end":
                self.stop_workers()
                return
            stage, k = cmd.get("stage"), cmd.get("round")
            try:
                if cmd.get("cmd") == "prepare":
                    res = self.prepare(cmd["cards"])
                elif cmd.get("group") is not None:
                    res = self.library_job(cmd["group"].index(self.rank), cmd["cards"], cmd["master"])
                elif cmd.get("partner") is None:
                    res = {"ok": True, "idle": True}
                elif stage == "tcp":
                    res = self.tcp_pair(k, int(cmd["partner"]), int(cmd["side"]))
                else:
                    res = self.library_job(int(cmd["side"]), cmd["cards"], cmd["master"])
            except (PeerTimeout, Refused, OSError) as exc:
                res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
            res.update(round=k, lport=free_port(self.addr, self.family))
            self.coord.send(res)

    # ---- the TCP stage
    def tcp_pair(self, k: int, partner: int, side: int) -> dict:
        deadline = time.monotonic() + self.cfg["pair_timeout"]
        sock = self._dial(k, partner, deadline) if side == 0 else self._accept(k, partner, deadline)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            lat = []
            small, small_in = b"\0" * 8, memoryview(bytearray(8))
            for _ in range(LATENCY_ROUNDS):  # side 0 pings, side 1 echoes
                t0 = time.perf_counter()
                if side == 0:
                    _send(sock, small, deadline)
                    _recv_exactly(sock, small_in, 8, deadline)
                    lat.append((time.perf_counter() - t0) / 2)
                else:
                    _recv_exactly(sock, small_in, 8, deadline)
                    _send(sock, small, deadline)
            size = int(self.cfg["bytes"])
            big, big_in = b"\1" * size, memoryview(bytearray(size))
            times = [_exchange(sock, big, big_in, deadline) for _ in range(int(self.cfg["loops"]) + 1)][1:]
        finally:
            sock.close()
        best = min(times)  # a slow link is slow every time, a busy CPU only in some
        return {"ok": True, "gbs": size / best / 1e9, "latency_s": statistics.median(lat) if lat else None}

    def _dial(self, k: int, partner: int, deadline: float) -> socket.socket:
        try:
            sock = socket.create_connection(tuple(self.peers[partner]), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            raise PeerTimeout(f"connection refused or timed out by rank {partner}: {exc}") from None
        line = json.dumps({"round": k, "from": self.rank, "mac": mac(self.token, "pair", k, self.rank, partner)})
        _send(sock, (line + "\n").encode(), deadline)
        _recv_exactly(sock, memoryview(bytearray(1)), 1, deadline)  # the partner took us: nothing before that
        return sock

    def _accept(self, k: int, partner: int, deadline: float) -> socket.socket:
        """The partner's connection of round k. Every connection's hello is read at once beside the others,
        so a stranger that connects and says nothing (or junk, or a stale round) delays nobody: it is
        closed, and the partner's connection is taken whenever its hello comes."""
        expect = mac(self.token, "pair", k, partner, self.rank)
        pending: dict[socket.socket, bytes] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PeerTimeout(f"timed out waiting for rank {partner} to connect")
                    for key, _ in sel.select(left):
                        if key.fileobj is self.listener:
                            try:
                                conn, _ = self.listener.accept()
                            except OSError:
                                continue
                            conn.setblocking(False)
                            pending[conn] = b""
                            sel.register(conn, selectors.EVENT_READ)
                            continue
                        conn = key.fileobj
                        try:
                            chunk = conn.recv(4096)
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:
                            chunk = b""
                        data = pending[conn] + chunk
                        if chunk and b"\n" not in data and len(data) <= 4096:
                            pending[conn] = data
                            continue
                        sel.unregister(conn)
                        del pending[conn]
                        line, _, rest = data.partition(b"\n")
                        if chunk and not rest and _proves(line, expect):
                            conn.setblocking(True)
                            _send(conn, b"K", deadline)
                            return conn
                        conn.close()  # junk, too long, closed, a stale round or a stranger
            finally:
                for conn in pending:
                    conn.close()

    # ---- the library stage: a job of its own per pair (or the confirm), killed at its deadline
    def node(self) -> dict:
        return node_of(self.cfg, self.rank)

    def prepare(self, layout: list) -> dict:
        """This host's card processes started and ready for a job over ``layout`` (within the start limit)."""
        cards = cards_of(self.cfg, self.rank)  # as the coordinator's layout counts this host
        if self.workers is None or len(self.workers.procs) != cards:
            self.stop_workers()
            self.workers = Workers(cards, self.node().get("env", {}))
        started = self.workers.ready(time.monotonic() + float(self.cfg["join_timeout"]))
        if started:
            self.stop_workers()
            return {"ok": False, "error": f"the card processes did not start: {started}"[:400]}
        return {"ok": True}

    def library_job(self, index: int, layout: list, master: list) -> dict:
        """This host's processes of a job over the hosts whose card counts are ``layout`` (this host the
        ``index``-th): one per card, ranks numbered host by host; killed when the job passes its deadline."""
        cards, world, base = int(layout[index]), sum(map(int, layout)), sum(map(int, layout[:index]))
        timeout = float(self.cfg["lib_timeout"])
        deadline = time.monotonic() + timeout
        loops = self.cfg["confirm_loops" if len(layout) > 2 else "lib_loops"]
        if self.workers is None or len(self.workers.procs) != cards:
            self.stop_workers()
            self.workers = Workers(cards, self.node().get("env", {}))
        # torch's import and the card's acquisition count against the start limit, not the pair's deadline
        started = self.workers.ready(time.monotonic() + float(self.cfg["join_timeout"]))
        if started:
            self.stop_workers()
            return {"ok": False, "error": f"the card processes did not start: {started}"[:400], "ranks": world}
        deadline = time.monotonic() + timeout
        # the process group's own limit past ours: on Gaudi there is none (WorkHCCL::wait), our kill decides
        job = {"bytes": self.cfg["lib_bytes"], "loops": loops, "timeout": 4 * timeout}
        env = {"MASTER_ADDR": str(master[0]), "MASTER_PORT": str(master[1]), "WORLD_SIZE": str(world)}
        outs = self.workers.run([{**job, "env": {**env, "RANK": str(base + i)}} for i in range(cards)], deadline)
        failed = [(i, o) for i, o in enumerate(outs) if o.get("error") or not o.get("seconds")]
        if failed:
            self.stop_workers()  # a group that failed may be stuck: the next job gets fresh processes
            i, o = failed[0]
            return {"ok": False, "error": f"card {i}: {o.get('error') or 'no result'}", "ranks": world}
        secs = max(o["seconds"] for o in outs)  # the slowest card's
        alg, bus = pairrounds.algbw_busbw(int(outs[0]["bytes"]), secs, world)
        return {
            "ok": True,
            "gbs": bus,
            "algbw": alg,
            "seconds": secs,
            "bytes": outs[0]["bytes"],
            "ranks": world,
            "backend": outs[0].get("backend"),
        }

    def stop_workers(self) -> None:
        if self.workers is not None:
            self.workers.kill()
            self.workers = None


class Workers:
    """This host's processes of the library stage, one per card the job uses (LOCAL_RANK = the card's place,
    the job's card visibility), each in a process group of its own. They import torch once and run one
    pair's job per line on stdin; a job past its deadline gets them all killed, and the next job starts
    fresh ones."""

    def __init__(self, cards: int, visible: dict):
        self.procs: list[subprocess.Popen] = []
        self.lines: list[queue.Queue] = []
        for i in range(cards):
            env = {**os.environ, **{str(k): str(v) for k, v in visible.items()}}
            env.update(LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(cards))
            env.pop(COLLECTIVE_TOKEN, None)  # the worker joins no rendezvous of ours
            proc = subprocess.Popen(
                [sys.executable, "-m", LIBRARY_MODULE],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # its own group: the kill takes whatever it started
            )
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
            self.procs.append(proc)
            self.lines.append(lines)
        self.waiting = list(range(cards))  # not yet "ready"

    def ready(self, deadline: float) -> str:
        """Wait until every worker has imported torch and taken its card; "" or what went wrong."""
        while self.waiting:
            i = self.waiting[0]
            try:
                said = self.lines[i].get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return f"card {i}: no answer within the start limit"
            if said.get("error"):
                return f"card {i}: {said['error']}"
            self.waiting.pop(0)
        return ""

    def run(self, jobs: list[dict], deadline: float) -> list[dict]:
        """Each worker's result of its job (one each), or an error; all killed past the deadline."""
        for proc, job in zip(self.procs, jobs):
            try:
                proc.stdin.write((json.dumps(job) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                pass  # it has exited: its queue says so
        outs = []
        for lines in self.lines:
            try:
                outs.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                self.kill()
                return [{"error": "timed out: the collective did not finish by the pair's deadline (killed)"}] * len(
                    jobs
                )
        return outs

    def kill(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for proc in self.procs:
            proc.wait()


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    """A worker's result records into ``lines``; its other output to ours (stderr); a record when it exits."""
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith(COLLECTIVE_MARKER):
            try:
                lines.put(json.loads(line[len(COLLECTIVE_MARKER) :]))
                continue
            except ValueError:
                pass
        print(line, file=sys.stderr, flush=True)
    lines.put({"error": f"exited {proc.wait()} without a result"})


def _proves(line: bytes, expect: str) -> bool:
    """Whether a pair connection's hello line carries the MAC ``expect``. Pure; junk is False."""
    try:
        hello = json.loads(line)
    except ValueError:
        return False
    return isinstance(hello, dict) and hmac.compare_digest(str(hello.get("mac", "")), expect)


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        sock.sendall(data)
    except socket.timeout:
        raise PeerTimeout("timed out sending (the partner stopped reading)") from None
    except OSError as exc:
        raise PeerTimeout(f"connection reset sending: {exc}") from None


def _exchange(sock: socket.socket, send: bytes, recv: memoryview, deadline: float) -> float:
    """Seconds for ``recv`` to fill while ``send`` goes the other way, both at once. A large message is
    timed from its first bytes on: how late the partner's process ran is no part of its link's figure."""
    errors: list = []

    def push() -> None:
        try:
            _send(sock, send, deadline)
        except PeerTimeout as exc:
            errors.append(exc)

    t0 = time.perf_counter()
    t = threading.Thread(target=push, daemon=True)
    t.start()
    first_at, first = _recv_exactly(sock, recv, len(send), deadline)
    end = time.perf_counter()
    t.join(max(0.01, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    n = len(send)
    if n >= 16 * CHUNK and first <= n // 2:
        return (end - first_at) * n / (n - first)
    return end - t0


def _recv_exactly(sock: socket.socket, buf: memoryview, n: int, deadline: float) -> tuple[float, int]:
    """Fill ``buf[:n]`` from ``sock``: (when the first bytes came, how many), in pieces of at most CHUNK."""
    got, first_at, first = 0, 0.0, 0
    while got < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            k = sock.recv_into(buf[got : min(n, got + CHUNK)])
        except socket.timeout:
            raise PeerTimeout(f"timed out receiving ({got} of {n} bytes)") from None
        except OSError as exc:
            raise PeerTimeout(f"connection reset receiving: {exc}") from None
        if not k:
            raise PeerTimeout(f"connection closed receiving ({got} of {n} bytes)")
        if not got:
            first_at, first = time.perf_counter(), k
        got += k
    return first_at, first


def main(environ=os.environ) -> int:
    host = socket.gethostname()
    rank, world = int(environ.get("RANK", "0")), int(environ.get("WORLD_SIZE", "1"))
    step = "start"
    coordinator: Optional[Coordinator] = None
    me: Optional[Agent] = None
    try:
        cfg = settings(environ)
        token = environ.get(COLLECTIVE_TOKEN, "").encode()
        if not token:
            raise Refused(f"{COLLECTIVE_TOKEN} is not set: the check's agents are started by gaudi-launch")
        master = (environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))
        if rank == 0:
            library = environ.get(COLLECTIVE_LIBRARY) == "1"
            coordinator = Coordinator(master[1], world, cfg, token, library=library)
        me = Agent(rank, world, master, cfg, token)
        step = "rendezvous"
        kind = device_kind(environ)
        table = me.rendezvous(kind)
        start = {"step": "start", "rank": rank, "host": host, "library": table["library"]}
        if table["library"] and kind == "hpu":
            start["device"] = card_name()  # the judge's line rate: Gaudi 3's differs from Gaudi 2's
        say(start)
        step = "rounds"
        me.serve(host)
        say({"step": "done", "rank": rank, "host": host})
    except Exception as exc:  # the launcher names the step and the host
        say({"step": step, "rank": rank, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
        if me is not None:
            me.stop_workers()  # in sessions of their own: the job's teardown of ours would not reach them
        if coordinator is not None:
            coordinator.thread.join(5)
        sys.stdout.flush()
        time.sleep(1)  # our exit ends the job: let the records already printed reach the launcher first
        os._exit(1)
    faulty = False
    if coordinator is not None:
        coordinator.thread.join(10)
        faulty = coordinator.faulty
    sys.stdout.flush()
    if faulty:
        time.sleep(1)  # our exit ends the job: let the records already printed reach the launcher first
    os._exit(1 if faulty else 0)


if __name__ == "__main__":
    sys.exit(main())
