"""A rank's own output relay, for launchers that mix their ranks' output (the deepspeed backend).

DeepSpeed's launch.py hands one pipe to every rank of a node and pdsh tags lines with the host only,
so nothing tells which rank printed a line, and launch.py reports a rank killed by a signal as
``sys.exit(-9)`` (exit 247) of the node, blaming no rank. So a rank started from a job file forks:
the child runs the script (it is the rank, see worker.py); the parent, the process DeepSpeed
started, relays the child's stdout and stderr line by line with a ``RANK_TAG`` the supervisor
takes off (``untag``), and a progress bar's ``\r`` states as lines marked ``PROGRESS``, the first
at once, then one every few seconds (progress.ProgressPace; the supervisor rewrites its line with
them on a terminal, prints them as lines elsewhere), waits for it, and when the child ended non-zero
without saying why (killed by a signal, ``os._exit``), writes the error record the worker would
have written. Then it ends as the child did, so launch.py sees the same status. A rank that was told to stop (teardown) is
not a failure: the child says so with ``TORN_DOWN`` before it ends, and the parent knows when it
was signalled itself.

If whatever reads the relay's output goes away (the launcher or its ssh session was killed), the
relay ends at once; the child's own watchdog then sees its pipe lose its reader and ends its
process group (worker.watch_launcher).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from typing import Callable, Optional

from gaudi_launch.inputs.envfile import secrets_in, straddling
from gaudi_launch.process.progress import LineSplitter, Piece, ProgressPace
from gaudi_launch.wire import ERROR_MARKER, TORN_DOWN, record_line

RANK_TAG = "@@gaudi-launch-rank@@"
PROGRESS = "@@gaudi-launch-progress@@"  # begins a relayed progress state (a \r update), not a finished line
LINE_MAX = 1 << 20  # a longer line is passed on in pieces of this size (the supervisor's read size)
_STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def tag(rank: str, line: bytes) -> bytes:
    return f"{RANK_TAG}{rank} ".encode() + line


def untag(line: str) -> tuple[Optional[int], str]:
    """'<RANK_TAG>3 text' -> (3, 'text'); any other line -> (None, line). Pure."""
    if line.startswith(RANK_TAG):
        number, sep, rest = line[len(RANK_TAG) :].partition(" ")
        if sep and number.isdigit():
            return int(number), rest
    return None, line


def unexplained_failure(
    status: int, explained: bool, stopped: bool, rank: Optional[int], pid: int, host: str, now: str
) -> Optional[dict]:
    """The error record for a rank that ended non-zero and said nothing (no record of its own, not
    torn down, its relay not signalled); None otherwise. ``status``: Popen's convention. Pure."""
    if status == 0 or explained or stopped:
        return None
    record = {"rank": rank, "host": host, "pid": pid, "time": now, "exit_code": status}
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        record.update(exit_code=128 - status, signal=name)
    return record


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class _Stream:
    def __init__(self, source: int, sink: int, rank: str, clock: Callable[[], float] = time.monotonic):
        self.source, self.sink, self.rank = source, sink, rank
        # a secret of the job (its values are in this process's environment) cut by the split is kept whole
        secrets = secrets_in(os.environ)
        self.splitter = LineSplitter(LINE_MAX, hold=(lambda data: straddling(data, secrets)) if secrets else None)
        self.pace = ProgressPace()
        self.clock = clock
        self.explained = False  # the rank wrote its error record, or said it was told to stop

    def feed(self, data: bytes) -> None:
        self._pass(self.splitter.feed(data))

    def close(self) -> None:
        """The rank's output ended: what is left of its last line."""
        self._pass(self.splitter.close())

    def due(self) -> None:
        """A stalled bar's newest state, when its time has come."""
        self._state(self.pace.due(self.clock()))

    def _pass(self, pieces: list[Piece]) -> None:
        for text, final in pieces:
            if not final:
                self._state(self.pace.offer(text, self.clock()))
                continue
            self.pace.done()
            if text.startswith((ERROR_MARKER, TORN_DOWN)):
                self.explained = True
                if text.startswith(TORN_DOWN):
                    continue  # for the relay only
            _write_all(self.sink, tag(self.rank, text.encode() + b"\n"))

    def _state(self, text: Optional[str]) -> None:
        if text is not None:
            _write_all(self.sink, tag(self.rank, (PROGRESS + text).encode() + b"\n"))


def start(rank: str) -> None:
    """Fork. The child returns (it is the rank, its stdout/stderr now pipes to us); this process
    relays and never returns."""
    pipes = [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:
        for fd, (r, w) in zip((1, 2), pipes):
            os.dup2(w, fd)
            os.close(r)
            os.close(w)
        return
    code = 1
    try:
        for r, w in pipes:
            os.close(w)
        code = _relay(pid, rank, [_Stream(r, fd, rank) for fd, (r, _) in zip((1, 2), pipes)])
    finally:
        _end_as(code)


def _relay(pid: int, rank: str, streams: list[_Stream]) -> int:
    stopped: list[int] = []

    def forward(signum, _frame) -> None:
        stopped.append(signum)
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for sig in _STOP:
        signal.signal(sig, forward)
    try:
        child_fd: Optional[int] = os.pidfd_open(pid)
    except (AttributeError, OSError):
        child_fd = None  # no pidfd (old kernel): look every 100 ms
    poller = select.poll()
    by_fd: dict[int, _Stream] = {}
    for s in streams:
        poller.register(s.source, select.POLLIN)
        poller.register(s.sink, 0)  # POLLERR/POLLHUP: nobody reads our output any more
        by_fd[s.source] = s
    if child_fd is not None:
        poller.register(child_fd, select.POLLIN)
    status: Optional[int] = None
    while status is None:
        timeout = None if child_fd is not None else 100.0  # ms
        for s in streams:  # wake up for a stalled progress bar's state
            wait = s.pace.wait(s.clock())
            if wait is not None:
                timeout = wait * 1000 + 1 if timeout is None else min(timeout, wait * 1000 + 1)
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        for fd, ev in events:
            stream = by_fd.get(fd)
            if stream is not None:
                data = os.read(fd, 65536) if ev & (select.POLLIN | select.POLLHUP | select.POLLERR) else b""
                if data:
                    stream.feed(data)
                else:
                    poller.unregister(fd)
            elif fd != child_fd and ev & (select.POLLERR | select.POLLHUP):
                os._exit(1)  # our reader is gone: the rank's watchdog sees its pipe lose us next
        for s in streams:
            s.due()
        waited, raw = os.waitpid(pid, os.WNOHANG)
        if waited:
            status = os.waitstatus_to_exitcode(raw)
    for s in streams:  # what the rank wrote before it ended (not what an orphan writes later)
        os.set_blocking(s.source, False)
        while True:
            try:
                data = os.read(s.source, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            s.feed(data)
        s.close()
    err = streams[1]
    record = unexplained_failure(
        status,
        err.explained,
        bool(stopped),
        int(rank) if rank.isdigit() else None,
        pid,
        socket.gethostname(),
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    if record is not None:
        err.feed(record_line(record).encode())
    return status


def _end_as(status: int) -> None:
    """End this process as the rank ended: the same exit code, or the same signal."""
    if status < 0:
        try:
            signal.signal(-status, signal.SIG_DFL)
            os.kill(os.getpid(), -status)
        except (OSError, ValueError):
            pass
        os._exit(128 - status)
    os._exit(status & 0xFF)
