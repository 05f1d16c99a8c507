"""One rank of the collective check's first stage: the links between the check's ranks over plain TCP.

The launcher starts this module, one rank per host, through the job's own backend. It imports no torch
(torch's import is about 1.1 s of CPU a rank: 16 ranks on a 2-core machine waited 9 s for it), so it
measures the fabric within seconds:
  1. a rendezvous at MASTER_ADDR:MASTER_PORT, served by rank 0: each rank gives the address it reaches
     the master from (the job's interface) and a port of its own, and its device kind;
  2. on the ring and its shifted ring (rank r sends to r+s and receives from r-s, every rank at once after
     a barrier) a small message's time (latency) and the best of ROUNDS times of SIZE bytes (bandwidth).
The records are those of runtime/collective_check.py (marker lines, "stage": "tcp"), judged alike.

On a CPU, gloo's transport is exactly such TCP connections on the same interface, so this stage is the
verdict. When any rank's device is a Gaudi or a GPU (or GAUDI_LAUNCH_COLLECTIVE_LIBRARY=1), hccl or nccl
take another path: every rank then runs runtime/collective_check.py in this same process (the library's
all-reduce and rings, torch imported only then), and that stage alone is judged.
Every wait is bounded by the step time limit: a rank that does not answer is named, not waited on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import socket
import statistics
import sys
import threading
import time
from typing import Optional

from gaudi_launch.wire import COLLECTIVE, COLLECTIVE_LIBRARY, COLLECTIVE_MARKER, DEVICE

LIBRARY_MODULE = "gaudi_launch.runtime.collective_check"
LATENCY_ROUNDS = 10
CHUNK = 64 << 10  # one recv at most: the first piece's arrival starts a large message's clock
STAGE = "tcp"


class PeerTimeout(RuntimeError):
    """Another rank did not answer in time (the judge reads "timed out": not this rank's fault)."""


def say(record: dict) -> None:
    print(COLLECTIVE_MARKER + json.dumps({**record, "stage": STAGE}, sort_keys=True), flush=True)


def shifts(world: int) -> list[int]:
    """The ring (1) and its shifted ring (2): two different partners per host from 3 hosts on."""
    return [1] if world <= 2 else [1, 2]


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


def _line(f, what: str) -> str:
    try:
        line = f.readline()
    except socket.timeout:
        raise PeerTimeout(f"timed out waiting for {what}") from None
    except OSError as exc:
        raise PeerTimeout(f"connection reset waiting for {what}: {exc}") from None
    if not line:
        raise PeerTimeout(f"connection closed waiting for {what}")
    return line.decode().strip()


class Coordinator:
    """Rank 0's rendezvous and barriers: a thread that answers every rank's line once all have sent one."""

    def __init__(self, port: int, world: int, timeout: float, library: bool = False):
        self.world, self.timeout, self.library = world, timeout, library
        if socket.has_dualstack_ipv6():  # MASTER_ADDR may resolve to either family
            self.sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self.sock = socket.create_server(("", port))
        self.thread = threading.Thread(target=self._serve, name="link-check-coordinator", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conns: dict[int, tuple[socket.socket, object]] = {}
        try:
            if self._rendezvous(conns):  # the library stage follows: its store takes MASTER_PORT next
                for c, f in conns.values():
                    c.settimeout(self.timeout)
                    f.read()  # until the rank closes: the TIME_WAIT is its, never the port's
                return
            while conns:  # barriers ("B") until every rank says it is done ("D")
                words = {}
                deadline = time.monotonic() + self.timeout
                for r, (c, f) in sorted(conns.items()):
                    c.settimeout(max(0.01, deadline - time.monotonic()))
                    try:
                        words[r] = _line(f, f"rank {r}")
                    except PeerTimeout:
                        self._tell_missing(conns, [r])
                        return
                if all(w == "D" for w in words.values()):
                    break
                for c, _ in conns.values():
                    c.sendall(b"G\n")
        except OSError:
            pass
        finally:
            for c, _ in conns.values():
                c.close()
            self.sock.close()

    def _rendezvous(self, conns: dict) -> bool:
        """Every rank's address and port to every rank; whether the library stage follows."""
        seen: dict[int, dict] = {}
        deadline = time.monotonic() + self.timeout
        while len(seen) < self.world:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                c, _ = self.sock.accept()
                c.settimeout(max(0.01, deadline - time.monotonic()))
                f = c.makefile("rb")
                hello = json.loads(_line(f, "a rank's address"))
            except (socket.timeout, PeerTimeout, ValueError):
                if time.monotonic() >= deadline:
                    self._tell_missing(conns, [r for r in range(self.world) if r not in seen])
                    raise OSError("rendezvous incomplete") from None
                continue
            r = int(hello["rank"])
            seen[r], conns[r] = hello, (c, f)
        library = self.library or any(h["kind"] != "cpu" for h in seen.values())
        table = {"peers": [[seen[r]["addr"], seen[r]["port"]] for r in range(self.world)], "library": library}
        for c, _ in conns.values():
            c.sendall((json.dumps(table) + "\n").encode())
        return library

    def _tell_missing(self, conns: dict, missing: list[int]) -> None:
        for r, (c, _) in conns.items():
            if r not in missing:
                try:
                    c.sendall(f"T {','.join(map(str, missing))}\n".encode())
                except OSError:
                    pass


class Rank:
    """One rank's side: its coordinator connection, its listener and its links of each shift."""

    def __init__(self, rank: int, world: int, master: tuple[str, int], timeout: float):
        self.rank, self.world, self.timeout = rank, world, timeout
        deadline = time.monotonic() + timeout
        while True:  # rank 0's coordinator may not listen yet
            try:
                self.coord = socket.create_connection(master, timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise PeerTimeout(f"timed out connecting to the rendezvous at {master[0]}:{master[1]}") from None
                time.sleep(0.05)
        self.coord.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.coord.settimeout(timeout + 5)  # the coordinator's own limit fires first and names the rank
        self.cf = self.coord.makefile("rb")
        addr = self.coord.getsockname()[0]  # the interface this host reaches the master on: the job's
        self.listener = socket.create_server((addr, 0), family=self.coord.family)
        self.listener.settimeout(timeout)
        self.addr, self.port = addr, self.listener.getsockname()[1]

    def rendezvous(self, kind: str) -> dict:
        hello = {"rank": self.rank, "addr": self.addr, "port": self.port, "kind": kind}
        self.coord.sendall((json.dumps(hello) + "\n").encode())
        return self._answer("the rendezvous")

    def _answer(self, what: str):
        line = _line(self.cf, f"the coordinator (rank 0) at {what}")
        if line.startswith("T "):
            raise PeerTimeout(f"timed out at {what}: no answer from rank(s) {line[2:]}")
        return json.loads(line) if line.startswith("{") else line

    def barrier(self) -> None:
        self.coord.sendall(b"B\n")
        self._answer("a barrier")

    def done(self) -> None:
        self.coord.sendall(b"D\n")

    def close(self) -> None:
        for part in (self.cf, self.coord, self.listener):  # the file too: it holds the socket open
            part.close()

    def connect(self, peers: list, s: int) -> tuple[socket.socket, socket.socket]:
        """(to r+s, from r-s): connections of this shift, each opened by its sender."""
        dst = (self.rank + s) % self.world
        out: list = []

        def dial() -> None:
            try:
                c = socket.create_connection(tuple(peers[dst]), timeout=self.timeout)
                c.sendall(f"{self.rank:08d}".encode())
                out.append(c)
            except OSError as exc:
                out.append(exc)

        t = threading.Thread(target=dial, daemon=True)
        t.start()
        try:
            inc, _ = self.listener.accept()
        except socket.timeout:
            raise PeerTimeout(f"timed out waiting for rank {(self.rank - s) % self.world} to connect") from None
        t.join(self.timeout)
        if not out or isinstance(out[0], Exception):
            raise PeerTimeout(f"connection refused or timed out by rank {dst}: {out[0] if out else 'no answer'}")
        for c in (out[0], inc):
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(self.timeout)
        _recv_exactly(inc, memoryview(bytearray(8)), 8)  # the sender's rank (not needed: one per shift)
        return out[0], inc

    def exchange(self, to: socket.socket, frm: socket.socket, send: bytes, recv: memoryview) -> float:
        """Seconds for ``recv`` to fill from r-s while ``send`` goes to r+s, both after a barrier. A large
        message is timed from its first bytes on: how late the sender's process ran after the barrier
        (16 ranks on 2 cores) is then no part of its link's figure."""
        self.barrier()
        errors: list = []

        def push() -> None:
            try:
                to.sendall(send)
            except OSError as exc:
                errors.append(exc)

        t0 = time.perf_counter()
        t = threading.Thread(target=push, daemon=True)
        t.start()
        first_at, first = _recv_exactly(frm, recv, len(send))
        end = time.perf_counter()
        t.join(self.timeout)
        if errors:
            raise PeerTimeout(f"connection reset sending: {errors[0]}")
        n = len(send)
        if n >= 16 * CHUNK and first <= n // 2:
            return (end - first_at) * n / (n - first)
        return end - t0


def _recv_exactly(sock: socket.socket, buf: memoryview, n: int) -> tuple[float, int]:
    """Fill ``buf[:n]`` from ``sock``: (when the first bytes came, how many), in pieces of at most CHUNK."""
    got, first_at, first = 0, 0.0, 0
    while got < n:
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


def measure(me: Rank, peers: list, size: int, rounds: int, host: str, at: list) -> None:
    small, big = b"\0" * 8, b"\1" * size
    small_in, big_in = memoryview(bytearray(8)), memoryview(bytearray(size))
    for s in shifts(me.world):
        at[0] = f"ring+{s}"
        to, frm = me.connect(peers, s)
        lat = [me.exchange(to, frm, small, small_in) for _ in range(LATENCY_ROUNDS)]
        bw = [me.exchange(to, frm, big, big_in) for _ in range(rounds + 1)][1:]  # the first opens the window
        say(
            {
                "step": at[0],
                "rank": me.rank,
                "host": host,
                "src": (me.rank - s) % me.world,
                "seconds": min(bw),  # the best round: a slow link is slow every round, a busy CPU only in some
                "latency_s": statistics.median(lat),
                "bytes": size,
            }
        )
        to.close()
        frm.close()


def main(environ=os.environ) -> int:
    size, rounds, timeout = environ.get(COLLECTIVE, "4194304,5,20").split(",")
    size, rounds, timeout = int(size), int(rounds), float(timeout)
    host = socket.gethostname()
    rank, world = int(environ.get("RANK", "0")), int(environ.get("WORLD_SIZE", "1"))
    at = ["start"]  # the step under way, for the error record
    coordinator: Optional[Coordinator] = None
    me: Optional[Rank] = None
    try:
        master = (environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))
        if rank == 0:
            coordinator = Coordinator(master[1], world, timeout, library=environ.get(COLLECTIVE_LIBRARY) == "1")
        me = Rank(rank, world, master, timeout)
        table = me.rendezvous(device_kind(environ))
        if table["library"]:
            me.close()  # before rank 0's coordinator lets MASTER_PORT go for the library's store
            if coordinator is not None:
                coordinator.thread.join(timeout)
            # the library stage, in this process (the rank the backend started): torch is imported only here
            runpy.run_module(LIBRARY_MODULE, run_name="__main__", alter_sys=True)
            return 0
        say({"step": "start", "rank": rank, "host": host, "backend": STAGE})
        measure(me, table["peers"], size, rounds, host, at)
        at[0] = "done"
        me.barrier()
        me.done()
        say({"step": "done", "rank": rank, "host": host})
    except Exception as exc:  # the launcher names the step and the host; the others time out on their own
        say({"step": at[0], "rank": rank, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
        sys.stdout.flush()
        time.sleep(1)  # the peers' limits fire within moments: let them say theirs before the job ends
        os._exit(1)
    if coordinator is not None:
        coordinator.thread.join(5)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
