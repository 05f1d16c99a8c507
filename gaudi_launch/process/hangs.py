"""The launcher side of hang detection (--hang-timeout S).

When no rank advanced (heartbeats.py) for S seconds, every rank on this host is asked for its
Python stacks (faulthandler, DUMP_SIGNAL), and one line says where they wait, grouped: "rank 3 in
time.sleep from step() at train.py:30; ranks 0-2 in all_reduce (distributed_c10d.py:3252) from step() at
train.py:41": the frame it waits in and the user's function around it. The full stacks go to the log
directory; then the job is torn down like any failure (and restarted with --restart-on hang).
Ranks on other hosts cannot be reached for stacks (their heartbeats stay on their host): they are
named as such. Parsing and grouping are pure functions.
"""

from __future__ import annotations

import errno
import linecache
import os
import re
import shutil
import socket
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.idranges import rank_words
from gaudi_launch.process.heartbeats import DUMP_SIGNAL, start_time
from gaudi_launch.process.logfiles import open_log, open_log_dir
from gaudi_launch.remote.jobdir import create

SETTLE_S = 5.0  # how long the ranks get to write their stacks
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_LIBRARY_DIRS = tuple(p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p)
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the gaudi_launch package


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str


@dataclass
class Thread:
    ident: str
    current: bool  # the thread the signal was delivered to
    frames: list[Frame]  # innermost first, as faulthandler writes them


def parse_stacks(text: str) -> list[Thread]:
    """faulthandler's output (several dumps: the last one) -> its threads. Pure."""
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if m.group(2) in {t.ident for t in threads}:
                threads = []  # a second dump of the same process: keep the newest
            threads.append(Thread(m.group(2), m.group(1) == "Current thread", []))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    return threads


def main_thread(threads: Sequence[Thread]) -> Optional[Thread]:
    """The thread running the user's script: the one runpy started it in (the bootstrap's own
    watchdog thread and the script's threads start in threading's _bootstrap). Pure."""
    for t in threads:
        if any(f.func == "_run_code" for f in t.frames):
            return t
    for t in threads:
        if t.frames and t.frames[-1].func != "_bootstrap":
            return t
    return next((t for t in threads if t.current), threads[0] if threads else None)


class Place(NamedTuple):
    """Where a rank's main thread waits: the frame it waits in, and the user's code around it."""

    what: str  # the function it waits in ("all_reduce"), or the call on the user's line ("time.sleep")
    inner: str  # that function's file:line; "" when the wait is a C call made on the user's line
    func: str  # the user's function around it; "" at a script's top level
    where: str  # the user's file:line
    code: str  # the text of that line

    def describe(self) -> str:
        inner = f" ({self.inner})" if self.inner else ""
        func = f" from {self.func}()" if self.func else ""
        return f"{self.what}{inner}{func} at {self.where}"


def is_library(path: str) -> bool:
    """Python's own modules, installed packages (torch), frozen ones and this package. Pure."""
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return True
    return path.startswith(_OURS + os.sep) or any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS)


def is_runtime(path: str) -> bool:
    """Our training runtime (gaudi_launch/runtime), installed or not. Pure."""
    return os.sep + os.path.join("gaudi_launch", "runtime") + os.sep in path


def where_waiting(frames: Sequence[Frame], source: Callable[[str, int], str] = linecache.getline) -> Place:
    """Where a main thread waits (innermost frame first). Pure but for reading the source line. The
    user's frame is the innermost one outside libraries (else the innermost of our runtime, for a job
    started with ``-m gaudi_launch.runtime...``). Waiting inside a library: the innermost Python
    function and its place; inside C code (time.sleep, a C++ collective): the call on the user's line."""
    user = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    if user is None:
        user = next((i for i, f in enumerate(frames) if is_runtime(f.file)), None)
    if user is None:
        if frames:
            inner = frames[0]
            return Place(inner.func, "", "", _at(inner), "")
        return Place("?", "", "", "no Python frame", "")
    frame = frames[user]
    text = source(frame.file, frame.line).strip()
    func = "" if frame.func.startswith("<") else frame.func  # <module>: the script's top level
    if user:
        return Place(frames[0].func, _at(frames[0]), func, _at(frame), text)
    call = _CALL.search(text)
    return Place(call.group(1) if call else frame.func, "", func, _at(frame), text)


_BUILD_LOCK = os.path.join("torch", "utils", "file_baton.py")


def known_cause(frames: Sequence[Frame]) -> Optional[str]:
    """What a wait is known to mean, with what to do; None for an ordinary one. Pure."""
    if any(f.func == "wait" and f.file.endswith(_BUILD_LOCK) for f in frames):
        # torch's JIT builds (load_inline, DeepSpeed's ops on CPU such as shm_comm) take this lock in
        # every process and wait for it without a time limit or an owner to check.
        return (
            "waiting for torch's build lock of a JIT extension: a process killed while building it (DeepSpeed's "
            "CPU shm_comm op, a load_inline) left the file 'lock' in the extension's build directory under "
            "$TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions/py*_*/NAME/); when no build runs on this "
            "host, remove that file and relaunch"
        )
    return None


def _at(frame: Frame) -> str:
    return f"{os.path.basename(frame.file)}:{frame.line}"


def summarize(places: dict[int, Place], world_size: int, stalled_s: float) -> str:
    """One line: the ranks grouped by where they wait, the odd ones out first. Pure."""
    groups: dict[str, list[int]] = {}
    for rank, place in places.items():
        groups.setdefault(place.describe(), []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), min(kv[1])))
    parts = [f"{rank_words(ranks)} in {text}" for text, ranks in ordered]
    missing = [r for r in range(world_size) if r not in places]
    if missing:
        parts.append(f"{rank_words(missing)}: no stack (on another host, or not running)")
    return f"no rank advanced for {stalled_s:.0f} s: " + "; ".join(parts)


def check_watchable(plan) -> None:
    """Heartbeats and stacks are read on this host: some rank must run here, and not under a scheduler
    (srun's ranks on this node are not the launcher's). Pure."""
    if capabilities(plan.backend).scheduler or not any(is_local_host(n.host) for n in plan.nodes):
        raise UserError(
            "--hang-timeout watches the ranks on this host, and none runs here",
            where="--hang-timeout",
            hint="run gaudi-launch on one of the job's hosts (the first host of the hostfile)",
        )


class HangWatch:
    """Owns the heartbeat directory of a job (all its attempts) and decides when it hangs."""

    def __init__(
        self,
        timeout: float,
        directory: str,
        log_dir: Optional[str] = None,
        clock: Callable[[], float] = time.time,
        signal_rank: Callable[[int, int], None] = os.kill,
    ):
        self.timeout = timeout
        self.log_dir = log_dir
        # Made by jobdir.create, with an owner record: other jobs' clean-up leaves it alone while we live.
        self.directory = directory
        self.clock = clock
        self.signal_rank = signal_rank
        self.world_size = 0
        self.job_id = ""
        self.started = 0.0
        self.fired = False
        self.stacks_file: Optional[str] = None

    @property
    def interval(self) -> float:
        return min(2.0, self.timeout / 4)

    def create(self) -> None:
        create(self.directory)

    def begin(self, world_size: int, job_id: str) -> None:
        """A new attempt: the last one's beats, pids and stacks are gone."""
        for name in os.listdir(self.directory):
            if name.startswith("rank-"):
                os.unlink(os.path.join(self.directory, name))
        self.world_size, self.job_id = world_size, job_id
        self.started, self.fired, self.stacks_file = self.clock(), False, None

    def last_progress(self) -> float:
        newest = self.started
        try:
            names = os.listdir(self.directory)
        except OSError:
            return newest
        for name in names:
            if name.endswith(".beat"):
                try:
                    newest = max(newest, os.stat(os.path.join(self.directory, name)).st_mtime)
                except OSError:
                    pass
        return newest

    def check(self) -> Optional[str]:
        """None while some rank advanced in the last `timeout` seconds; else, once, the summary."""
        if self.fired:
            return None
        stalled = self.clock() - self.last_progress()
        if stalled < self.timeout:
            return None
        self.fired = True
        return self.dump(stalled)

    def _pids(self) -> dict[int, int]:
        pids, me = {}, socket.gethostname()
        for rank in range(self.world_size):
            try:
                with open(os.path.join(self.directory, f"rank-{rank}.pid")) as f:
                    host, pid, started = f.read().split()
            except (OSError, ValueError):
                continue
            # A shared filesystem may hold other hosts' pids; a rank that ended may have left its pid
            # to another process, which SIGUSR2 would kill.
            if host == me and pid.isdigit() and started.isdigit() and start_time(int(pid)) == int(started):
                pids[rank] = int(pid)
        return pids

    def _stack(self, rank: int) -> str:
        try:
            with open(os.path.join(self.directory, f"rank-{rank}.stack"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def dump(self, stalled: float) -> str:
        pids = self._pids()
        for rank, pid in pids.items():
            try:
                self.signal_rank(pid, DUMP_SIGNAL)
            except OSError:
                pids[rank] = 0  # already gone
        texts: dict[int, str] = {}
        deadline = self.clock() + SETTLE_S
        while True:  # faulthandler writes from the signal handler: done when the file stops growing
            now = {r: self._stack(r) for r, pid in pids.items() if pid}
            if now == texts and all(now.values()) or self.clock() >= deadline:
                texts = now
                break
            texts = now
            time.sleep(0.3)
        places, causes = {}, []
        for rank, text in texts.items():
            thread = main_thread(parse_stacks(text))
            if thread is not None:
                places[rank] = where_waiting(thread.frames)
                cause = known_cause(thread.frames)
                if cause and cause not in causes:
                    causes.append(cause)
        summary = summarize(places, self.world_size, stalled)
        lines = [summary]
        for rank, place in sorted(places.items()):
            if place.code:
                lines.append(f"  rank {rank} at {place.where}: {place.code}")
        lines += [f"  why: {cause}" for cause in causes]
        self.stacks_file, where = self._write_stacks(summary, texts)
        lines.append(where)
        return "\n".join(lines)

    def _write_stacks(self, summary: str, texts: dict[int, str]) -> tuple[Optional[str], str]:
        """(the file holding every rank's stacks, None when not written; the line that says where)."""
        if not self.log_dir:
            return None, "(--log-dir DIR keeps every rank's full stacks)"
        path = os.path.join(self.log_dir, f"hang-{self.job_id or 'job'}.txt")
        try:  # as the rank logs: a planted link or another user's file is refused, not written through
            dir_fd = open_log_dir(self.log_dir)
            try:
                f = open_log(os.path.basename(path), dir_fd)
            finally:
                os.close(dir_fd)
            with f:
                f.write(summary + "\n")
                for rank in range(self.world_size):
                    f.write(f"\n===== rank {rank} =====\n")
                    f.write(texts.get(rank) or "(no stack: on another host, or not running)\n")
        except UserError as exc:
            return None, f"(every rank's stacks not kept: cannot write {path}: {exc.message})"
        except OSError as exc:
            why = "it is a symbolic link (not followed)" if exc.errno == errno.ELOOP else str(exc)
            return None, f"(every rank's stacks not kept: cannot write {path}: {why})"
        return path, f"every rank's stacks: {path}"

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
