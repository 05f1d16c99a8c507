"""The one per-host fan-out (gaudi_launch/remote/fanout.py) and its users."""

from __future__ import annotations

import threading
import time

import pytest

from gaudi_launch.remote import fanout


def test_pool_is_as_wide_as_the_hosts_within_the_open_file_limit():
    assert fanout.pool_size(3, fd_limit=1024) == 3
    assert fanout.pool_size(1000, fd_limit=1024) == (1024 - 64) // fanout.FDS_PER_CALL
    assert fanout.pool_size(100000, fd_limit=1 << 20) == fanout.MAX_WORKERS
    assert fanout.pool_size(10, fd_limit=16) >= 4  # never starved to nothing
    assert fanout.pool_size(0, fd_limit=1024) == 1


def test_results_in_host_order_each_host_once_all_at_once():
    seen, lock, peak, running = [], threading.Lock(), [0], [0]

    def one(host):
        with lock:
            seen.append(host)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05 if host == "a" else 0.01)
        with lock:
            running[0] -= 1
        return host.upper()

    done = []
    out = fanout.per_host(["a", "b", "c", "b"], one, on_done=lambda h, r: done.append(h))
    assert list(out.items()) == [("a", "A"), ("b", "B"), ("c", "C")]
    assert sorted(seen) == ["a", "b", "c"] and sorted(done) == ["a", "b", "c"]
    assert peak[0] == 3  # one thread per host: nobody waits behind a slow host


def test_an_exception_is_raised_after_every_host_finished():
    finished = []

    def one(host):
        if host == "bad":
            raise RuntimeError("boom")
        time.sleep(0.02)
        finished.append(host)
        return 1

    with pytest.raises(RuntimeError, match="boom"):
        fanout.per_host(["bad", "x", "y"], one)
    assert sorted(finished) == ["x", "y"]


def test_a_host_past_the_timeout_gets_the_default():
    release = threading.Event()

    def one(host):
        if host == "slow":
            release.wait(5)
        return "ok"

    try:
        out = fanout.per_host(["fast", "slow"], one, timeout=0.3, default=lambda h: "late")
    finally:
        release.set()
    assert out == {"fast": "ok", "slow": "late"}


def test_the_per_host_loops_all_use_it():
    """Issue 15: one fan-out helper, not a thread loop per module."""
    import inspect

    from gaudi_launch.backends import deepspeed
    from gaudi_launch.remote import preflight, teardown
    from gaudi_launch.reports import environment as envreport

    for module in (envreport, preflight, teardown, deepspeed):
        src = inspect.getsource(module)
        assert "per_host(" in src, module.__name__
        assert "threading.Thread(" not in src and "ThreadPoolExecutor(" not in src, module.__name__
