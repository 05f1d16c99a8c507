"""The collective check's torch-free stage (runtime/link_check.py) with real processes on this machine:
the rendezvous, the rings and the marker records the launcher judges; a rank that never comes is named by
the others' time limit, not waited on; the device kind that decides whether the library stage follows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from gaudi_launch.reports.collective import judge, parse
from gaudi_launch.runtime import link_check


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(world: int, started: list[int], timeout: float = 3) -> list[str]:
    port = _free_port()
    procs = []
    for r in started:
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env["GAUDI_LAUNCH_COLLECTIVE"] = f"{1 << 20},2,{timeout}"
        env.pop("GAUDI_LAUNCH_COLLECTIVE_LIBRARY", None)
        env["GAUDI_LAUNCH_DEVICE"] = "cpu"
        argv = [sys.executable, "-m", "gaudi_launch.runtime.link_check"]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    return [line for p in procs for line in p.communicate(timeout=60)[0].splitlines()]


def test_three_ranks_measure_both_rings_without_torch():
    t0 = time.monotonic()
    lines = _ranks(3, [0, 1, 2])
    rep = judge(parse(lines), {0: "a", 1: "b", 2: "c"})
    assert rep.ok and rep.library == "tcp", rep.render_table()
    assert all(h.partners == sorted({"a", "b", "c"} - {h.host}) for h in rep.hosts)
    assert all(h.bandwidth_gbs > 0.01 and h.latency_us > 0 for h in rep.hosts)
    assert time.monotonic() - t0 < 20  # no torch import: far under the 1 s a rank that imports it takes


def test_a_rank_that_never_comes_is_named_by_the_others_time_limit():
    lines = _ranks(3, [0, 1], timeout=1)
    records = parse(lines)
    assert {r["rank"] for r in records if "timed out" in r.get("error", "")} == {0, 1}, lines
    rep = judge(records, {0: "a", 1: "b", 2: "c"})
    assert rep.to_json()["failed"] == ["c"] and rep.to_json()["slow"] == []


def test_the_library_stage_follows_when_any_rank_has_a_gaudi_or_a_gpu():
    def table(kinds: list[str], forced: bool = False) -> list[dict]:
        port = _free_port()
        coordinator = link_check.Coordinator(port, len(kinds), 5, library=forced)
        answers: list = [None] * len(kinds)

        def one(r: int) -> None:
            me = link_check.Rank(r, len(kinds), ("127.0.0.1", port), 5)
            answers[r] = me.rendezvous(kinds[r])
            me.close()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(len(kinds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        coordinator.thread.join(10)
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
