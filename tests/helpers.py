"""Helpers for tests that run real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie has already died)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def read_pids(directory: str) -> list[int]:
    """PIDs that test ranks wrote, one file each (*.pid), one PID per line."""
    pids = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".pid"):
            with open(os.path.join(directory, name)) as f:
                pids += [int(x) for x in f.read().split()]
    return pids


def all_gone(pids: Iterable[int], timeout: float = 10.0) -> bool:
    pids = list(pids)
    return wait_for(lambda: not any(alive(p) for p in pids), timeout=timeout)


def run_whole(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True), but a timeout kills everything cmd
    started in its session (a driver's launcher too), not cmd alone, so nothing outlives the test."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextlib.contextmanager
def links_hang_after(netns: str, after_bytes: int):
    """In network namespace ``netns``, every TCP connection stops carrying data after its first ``after_bytes``
    bytes, both ways (iptables connbytes): a link that accepts and then hangs, as a dead Gaudi link does."""
    rule = ["-p", "tcp", "-m", "connbytes", "--connbytes", f"{after_bytes}:", "--connbytes-dir", "both"]
    rule += ["--connbytes-mode", "bytes", "-j", "DROP"]
    ns = ["ip", "netns", "exec", netns, "iptables"]
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run([*ns, "-A", chain, *rule], check=True)
    try:
        yield
    finally:
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run([*ns, "-D", chain, *rule], check=False)


def job_env(env: dict) -> dict:
    """A plan's job variables without the per-plan random job-directory suffix (wire.JOB_DIR_SUFFIX), which
    every plan draws; checked to be there."""
    from gaudi_launch.wire import JOB_DIR_SUFFIX

    assert len(env.get(JOB_DIR_SUFFIX, "")) == 16, env
    return {k: v for k, v in env.items() if k != JOB_DIR_SUFFIX}
