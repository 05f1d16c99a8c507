"""The collective check's agents (runtime/link_check.py) with real processes on this machine: the rendezvous
(only agents holding the check's token join; junk, a spoofed hello or a wrong token is refused per
connection and the check goes on), the pairs in rounds and the marker records the launcher judges; an agent
that never comes is named, not waited on; the device kind that decides whether the library stage follows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from gaudi_launch.reports.collective import judge, parse
from gaudi_launch.runtime import link_check

TOKEN = "t" * 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg(timeout: float = 3, **extra) -> str:
    return json.dumps({"bytes": 1 << 20, "loops": 2, "pair_timeout": timeout, "join_timeout": timeout, **extra})


def _start(world: int, started: list[int], port: int, timeout: float = 3, tokens=None, env_of=None, cfg=None) -> list:
    procs = []
    for r in started:
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env["GAUDI_LAUNCH_COLLECTIVE"] = cfg or _cfg(timeout)
        env["GAUDI_LAUNCH_COLLECTIVE_TOKEN"] = (tokens or {}).get(r, TOKEN)
        env.pop("GAUDI_LAUNCH_COLLECTIVE_LIBRARY", None)
        env["GAUDI_LAUNCH_DEVICE"] = "cpu"
        env.update((env_of or {}).get(r, {}))
        argv = [sys.executable, "-m", "gaudi_launch.runtime.link_check"]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    return procs


def _lines(procs) -> list[str]:
    return [line for p in procs for line in p.communicate(timeout=60)[0].splitlines()]


def _ranks(world: int, started: list[int], timeout: float = 3, tokens=None) -> list[str]:
    return _lines(_start(world, started, _free_port(), timeout, tokens))


def test_four_agents_pair_in_rounds_without_torch():
    t0 = time.monotonic()
    lines = _ranks(4, [0, 1, 2, 3])
    records = parse(lines)
    rep = judge(records, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert rep.ok and rep.library == "tcp", rep.render_table()
    # two rounds of two disjoint pairs: every host has two partners, each pair measured once
    pairs = [r for r in records if r["step"] == "pair"]
    assert sorted((r["round"], r["a"], r["b"]) for r in pairs) == [(0, 0, 3), (0, 1, 2), (1, 0, 2), (1, 1, 3)]
    assert all(len(h.partners) == 2 for h in rep.hosts)
    assert all(h.bandwidth_gbs > 0.01 and h.latency_us > 0 for h in rep.hosts)
    assert time.monotonic() - t0 < 20  # no torch import: far under the 1 s a rank that imports it takes


def test_an_agent_that_never_comes_is_named_missing_not_waited_on():
    lines = _ranks(3, [0, 1], timeout=1)
    rep = judge(parse(lines), {0: "a", 1: "b", 2: "c"})
    # Only the hang is judged here: 64 KiB pairs of the stand-in on 2 busy cores measure noise, and CI once
    # saw a healthy host's two pairs just under the slow floor (0.025 against 0.026 GB/s).
    assert rep.to_json()["failed"] == ["c"] and "c" not in rep.to_json()["slow"], rep.render_table()
    assert "did not join the rendezvous" in rep.hosts[2].reason


def test_an_agent_with_another_token_cannot_join_and_is_named_missing():
    lines = _ranks(3, [0, 1, 2], timeout=1.5, tokens={2: "x" * 64})
    records = parse(lines)
    rep = judge(records, {0: "a", 1: "b", 2: "c"})
    assert rep.to_json()["failed"] == ["c"], rep.render_table()
    assert any("without the check's token" in r for r in rep.refused), rep.refused


def _hello(port: int, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.recv(1024)  # the nonce
        c.sendall(payload)
        try:
            c.recv(1024)
        except OSError:
            pass


def test_junk_and_spoofed_hellos_are_refused_one_by_one_and_the_check_goes_on():
    port = _free_port()
    procs = _start(3, [0], port, timeout=4)
    time.sleep(0.5)
    # junk, a huge line, a list, a rank out of range, and a well-formed hello claiming rank 2 without the token
    spoof = {"rank": 2, "addr": "127.0.0.1", "port": 9, "lport": 9, "kind": "cpu", "nonce": "n", "mac": "0" * 64}
    for payload in (
        b"\x00\xffjunk\n",
        b"{" * 70000 + b"\n",
        b"[1]\n",
        b'{"rank": 99}\n',
        json.dumps(spoof).encode() + b"\n",
    ):
        _hello(port, payload)
    procs += _start(3, [1, 2], port, timeout=4)
    records = parse(_lines(procs))
    rep = judge(records, {0: "a", 1: "b", 2: "c"})
    assert rep.ok, rep.render_table()  # the real agents joined after the junk: nobody blamed
    why = " | ".join(rep.refused)
    assert len(rep.refused) == 5, why
    assert "not JSON" in why and "not a JSON object" in why and "rank 99 is not one of 0..2" in why
    assert "a hello as rank 2 without the check's token" in why


def test_an_agent_refuses_a_rendezvous_that_does_not_hold_the_token():
    port = _free_port()
    fake = socket.create_server(("127.0.0.1", port))

    def serve():
        c, _ = fake.accept()
        c.sendall(b'{"nonce": "n"}\n')
        c.recv(4096)
        c.sendall(json.dumps({"peers": [["127.0.0.1", 1]], "library": False, "mac": "0" * 64}).encode() + b"\n")
        time.sleep(1)
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    lines = _lines(_start(2, [1], port, timeout=2))
    err = [r for r in parse(lines) if "error" in r]
    assert err and "answered without the check's token" in err[0]["error"], lines
    fake.close()


def test_stand_in_hpu_a_card_that_never_returns_is_killed_at_the_pair_deadline_and_its_host_named():
    # Every host's NIC is fine (the TCP stage passes); on host 2 the stand-in's collectives never start nor
    # return, as the bridge's WorkHCCL::wait on a dead Gaudi link: the agents kill each pair's processes at
    # its deadline and the rounds name host 2 alone; the three others confirm together.
    from tests.standin.fixture import STAND_IN_DIR

    hpu = {"PYTHONPATH": STAND_IN_DIR, "GAUDI_LAUNCH_DEVICE": "hpu", "DS_ACCELERATOR": "cpu"}
    env_of = {r: dict(hpu) for r in range(4)}
    env_of[2]["HPU_STAND_IN_HANG"] = "1"
    # 10 s a pair: a healthy pair's gloo set-up on the 2 shared cores of CI, four at once, fits in it
    cfg = _cfg(4, lib_timeout=10, lib_bytes=1 << 16, lib_loops=3, confirm_loops=2)
    cfg = cfg.replace('"join_timeout": 4', '"join_timeout": 60')  # torch's import, four at once on 2 cores
    t0 = time.monotonic()
    records = parse(_lines(_start(4, [0, 1, 2, 3], _free_port(), env_of=env_of, cfg=cfg)))
    took = time.monotonic() - t0
    rep = judge(records, {0: "a", 1: "b", 2: "c", 3: "d"})
    # Only the hang is judged here: 64 KiB pairs of the stand-in on 2 busy cores measure noise, and CI once
    # saw a healthy host's two pairs just under the slow floor (0.025 against 0.026 GB/s).
    assert rep.to_json()["failed"] == ["c"] and "c" not in rep.to_json()["slow"], rep.render_table()
    lib = [p for p in rep.pairs if p.stage == "library"]
    assert all(p.ok for p in rep.pairs if p.stage == "tcp") and lib, rep.render_table()
    assert all(("c" in p.hosts) != p.ok for p in lib), rep.render_table()  # exactly the pairs with c failed
    assert "killed" in rep.hosts[2].reason and rep.library == "hccl", rep.render_table()
    assert rep.allreduce_gbs is not None and not rep.confirm  # a, b, d together
    assert took < 2 * (10 + 3) + 60, took  # two library rounds at most their deadline, the start, the confirm


def test_the_library_stage_follows_when_any_rank_has_a_gaudi_or_a_gpu():
    def table(kinds: list[str], forced: bool = False) -> list[dict]:
        port = _free_port()
        cfg = {**link_check.DEFAULTS, "join_timeout": 5, "pair_timeout": 2}
        coordinator = link_check.Coordinator(port, len(kinds), cfg, TOKEN.encode(), library=forced)
        coordinator._stage = lambda *a: set()  # the rendezvous only
        coordinator.library = forced
        answers: list = [None] * len(kinds)

        def one(r: int) -> None:
            me = link_check.Agent(r, len(kinds), ("127.0.0.1", port), cfg, TOKEN.encode())
            answers[r] = me.rendezvous(kinds[r])

        threads = [threading.Thread(target=one, args=(r,)) for r in range(len(kinds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return answers

    assert [a["library"] for a in table(["cpu", "cpu"])] == [False, False]
    assert [a["library"] for a in table(["cpu", "hpu"])] == [True, True]  # every rank, or the others would hang
    assert [a["library"] for a in table(["cpu", "cpu"], forced=True)] == [True, True]
    peers = table(["cpu", "cpu", "cpu"])[2]["peers"]
    assert len(peers) == 3 and all(addr == "127.0.0.1" and port > 0 for addr, port in peers)


def test_the_device_kind_is_told_without_importing_torch(tmp_path):
    (tmp_path / "version.py").write_text("cuda: Optional[str] = '12.4'\nhip: Optional[str] = None\n")

    class Spec:
        origin = str(tmp_path / "__init__.py")

    def finder(*present):
        return lambda name: Spec() if name in present else None

    no_driver, driver = (lambda p: False), (lambda p: p == "/proc/driver/nvidia/version")
    assert link_check.device_kind({"GAUDI_LAUNCH_DEVICE": "cpu"}, finder("habana_frameworks")) == "cpu"
    assert link_check.device_kind({}, finder("habana_frameworks", "torch")) == "hpu"
    assert link_check.device_kind({}, finder("torch"), driver) == "cuda"
    assert link_check.device_kind({}, finder("torch"), no_driver) == "cpu"  # a CUDA build on a machine without one
    (tmp_path / "version.py").write_text("cuda: Optional[str] = None\nhip: Optional[str] = None\n")
    assert link_check.device_kind({}, finder("torch"), driver) == "cpu"  # a CPU build
    code = "import sys, gaudi_launch.runtime.link_check; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_stranger_at_an_agents_pair_port_delays_nobody():
    # the partner's hello is taken while a silent connection and a junk one are still open
    me = object.__new__(link_check.Agent)
    me.rank, me.token = 1, TOKEN.encode()
    me.listener = socket.create_server(("127.0.0.1", 0))
    port = me.listener.getsockname()[1]
    silent = socket.create_connection(("127.0.0.1", port))
    junk = socket.create_connection(("127.0.0.1", port))
    junk.sendall(b"\x00junk\n")
    stale = socket.create_connection(("127.0.0.1", port))  # a hello of another round
    stale.sendall((json.dumps({"mac": link_check.mac(TOKEN.encode(), "pair", 6, 0, 1)}) + "\n").encode())
    answer = []

    def partner():
        time.sleep(0.3)
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall((json.dumps({"mac": link_check.mac(TOKEN.encode(), "pair", 7, 0, 1)}) + "\n").encode())
        answer.append(c.recv(1))
        c.close()

    t = threading.Thread(target=partner)
    t.start()
    t0 = time.monotonic()
    conn = me._accept(7, 0, time.monotonic() + 5)
    t.join(5)
    assert time.monotonic() - t0 < 2 and answer == [b"K"]
    conn.close()
    assert junk.recv(10) == b"" and stale.recv(10) == b""  # closed by the agent
    for c in (silent, junk, stale, me.listener):
        c.close()


def test_an_agent_reached_over_a_v4_mapped_address_listens_on_the_ipv4_one():
    server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    c = socket.create_connection(("::ffff:127.0.0.1", server.getsockname()[1]))
    addr, family = link_check.own_address(c)
    assert (addr, family) == ("127.0.0.1", socket.AF_INET)
    socket.create_server((addr, 0), family=family).close()  # the mapped form gave EINVAL here
    c.close()
    server.close()
