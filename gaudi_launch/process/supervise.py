"""The supervisor: owns every process of a job from spawn to reap.

Each process gets its own session (so its process group is ours to signal and a terminal's Ctrl-C
reaches only the launcher), its output is streamed line by line with a ``[rank N]`` prefix, and the
first non-zero exit tears the rest down: SIGTERM to every other process group, SIGKILL after the
grace period. Signals to the launcher (INT, TERM, HUP) tear the job down the same way. The result is
a record (``JobResult``) with one failure summary, root cause first, or a short one of a job that ended
well (failures.py decides and writes them).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, TextIO

from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.idranges import rank_words
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.process import placement
from gaudi_launch.process.failures import (
    Culprit,
    ProcResult,
    ProcState,
    find_culprit,
    format_success,
    format_summary,
    job_exit_code,
    output_dir,
    signal_name,
)
from gaudi_launch.process.logfiles import open_log, open_log_dir
from gaudi_launch.process.progress import LineSplitter, ProgressPace
from gaudi_launch.process.relay import PROGRESS
from gaudi_launch.remote.teardown import describe_unseen
from gaudi_launch.wire import ERROR_MARKER, STARTED, parse_record

TAIL_KEEP = 200  # lines of output remembered per process for the summary
TAIL_LINE_CHARS = 2000  # each remembered line is cut to this: tails stay bounded in bytes too
LINE_READ_MAX = 1 << 20  # bytes read as one line at most (a line without newline never ends)
RECORDS_KEEP = 1024  # error records kept per process (one per failing rank; a loop could print more)
RANK_GROUPS_KEEP = 64  # process groups remembered per rank for the sweep (one per restart; a loop could print more)
_COLORS = ["36", "33", "35", "32", "34", "31", "96", "93"]


@dataclass
class ProcSpec:
    """One process to run. ``env`` is its whole environment."""

    rank: int
    host: str
    argv: list[str]
    env: dict[str, str]
    cwd: Optional[str] = None
    label: Optional[str] = None
    # For one process that starts many ranks (mpirun, deepspeed, srun): rank -> host. The backend's
    # hooks (Hooks: demux, explain, stop, alarm) apply to such a process.
    ranks: Optional[dict[int, str]] = None

    @property
    def name(self) -> str:
        return self.label or f"rank {self.rank}"

    @property
    def rank_hosts(self) -> dict[int, str]:
        return self.ranks or {self.rank: self.host}


Demux = Callable[[Optional[str]], list[tuple[Optional[int], str]]]


@dataclass(frozen=True)
class Hooks:
    """What a backend adds to the supervisor's own work, every part optional. The first four act on
    a launcher process (one that starts many ranks: ProcSpec.ranks), the others on the whole job."""

    # Makes a function that tells which rank a line of the launcher's output came from (called with
    # None at the end of the stream to flush what it holds).
    demux: Optional[Callable[[], Demux]] = None
    # Reads the launcher's own report of which rank failed, from its output lines.
    explain: Optional[Callable[[list[str]], Optional[Culprit]]] = None
    # Stops the ranks the launcher started elsewhere (job-scoped, on every host). With it, the
    # launcher's process group gets only SIGKILL: its own SIGTERM handler may do harm (DeepSpeed's
    # runner pkills by pattern on every host).
    stop: Optional[Callable[[int], None]] = None
    # A line of the launcher's output that means one of its ranks failed (pdsh's "ssh exited with
    # exit code 1"): the job is torn down then, not when the launcher gets round to exiting.
    alarm: Optional[Callable[[str], bool]] = None
    # The host watch (watch.py): a message once a host of the job stops answering.
    watch: Optional[Callable[[], Optional[str]]] = None
    # The job-id sweep (teardown.job_sweeper): signals every process that carries the job's id on
    # every host, which reaches what left its process group (a rank's setsid/double-fork daemon). Called as
    # sweep(sig, groups): groups() is {host: the process groups its ranks lead} (wire.STARTED), asked once the
    # sweep knows the hosts (srun's); what is left in those groups is reported too.
    sweep: Optional[Callable[..., dict]] = None
    # Filled by the supervisor with the session id of each process it starts here (each starts a session of
    # its own): the sweep (job_sweeper's groups) ties another user's process left in one to the job even
    # once the process that started it has exited (a rank's `sudo -u` orphan).
    sessions: Optional[set] = None
    # At the start-up deadline: what the backend knows of why ranks have not started, with what to do
    # (mpirun: the hosts whose daemon's start never returned), added to the launch failure's message.
    starting: Optional[Callable[[], Optional[str]]] = None
    # While some rank has not started: called every START_CHECK_S with the hosts where a rank has started;
    # a message ends the launch as a launch failure (mpirun: a daemon that died before it reported back,
    # which mpirun itself would wait for until --start-timeout).
    start_check: Optional[Callable[[set], Optional[str]]] = None


NO_HOOKS = Hooks()
START_CHECK_S = 2.0  # how often Hooks.start_check is asked while ranks are starting


class Event(enum.Enum):
    """What the supervisor's loop hears from its threads (each with its value)."""

    EXITED = "exited"  # a process ended (its index)
    RANK_FAILED = "rank failed"  # a launcher's rank failed, said its record or alarm (the launcher's index)
    HOST_LOST = "host lost"  # the watch's message
    HUNG = "hung"  # --hang-timeout's message
    MISPLACED = "misplaced"  # ranks not where the plan put them (placement.py's message)
    START_FAILED = "start failed"  # Hooks.start_check's message
    NOT_STARTED = "not started"  # --start-timeout: (ranks waiting, ranks started)
    SIGNAL = "signal"  # INT, TERM or HUP to the launcher (its number)


@dataclass
class JobResult:
    exit_code: int
    procs: list[ProcResult]
    first_failure: Optional[ProcResult]
    culprit: Optional[Culprit]
    interrupted_by: Optional[str]
    summary: str
    hung: Optional[str] = None  # --hang-timeout: where the ranks waited when no rank advanced
    lost: Optional[str] = None  # a host that stopped answering (watch.py's message)
    not_started: Optional[str] = None  # --start-timeout: which ranks had not started in time

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def exit_codes(self) -> dict[int, Optional[int]]:
        return {p.rank: p.returncode for p in self.procs}


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a SIGKILLed launcher leaves no orphans
    except Exception:
        pass


class _Proc:
    def __init__(self, index: int, spec: ProcSpec, hooks: Hooks):
        self.index = index
        self.spec = spec
        self.hooks = hooks if spec.ranks is not None else NO_HOOKS  # a launcher's hooks
        self.popen: Optional[subprocess.Popen] = None
        self.started = 0.0
        self.ended: Optional[float] = None
        self.returncode: Optional[int] = None
        self.tail: deque[str] = deque(maxlen=TAIL_KEEP)
        self.rank_tails: dict[int, deque[str]] = {}
        self.records: list[dict] = []
        self.readers: list[threading.Thread] = []
        self.state = ProcState.NOT_STARTED
        self.killed = False


class Supervisor:
    def __init__(
        self,
        specs: list[ProcSpec],
        hooks: Hooks = NO_HOOKS,
        *,
        grace: float = 10.0,
        log_dir: Optional[str] = None,
        stdout: Optional[TextIO] = None,
        stderr: Optional[TextIO] = None,
        color: Optional[bool] = None,
        mask: Callable[[str], str] = lambda s: s,
        hold: Optional[Callable[[bytes], int]] = None,
        handle_signals: bool = True,
        watch_interval: float = 3.0,
        console_ranks: Optional[Sequence[int]] = None,
        hang_check: Optional[Callable[[], Optional[str]]] = None,
        hang_interval: float = 2.0,
        start_timeout: Optional[float] = None,
        left_out: Sequence[str] = (),
        results: Optional[str] = None,
    ):
        self.procs = [_Proc(i, s, hooks) for i, s in enumerate(specs)]
        self.grace = grace
        self.log_dir = log_dir
        self.out = stdout or sys.stdout
        self.err = stderr or sys.stderr
        if color is None:
            color = _isatty(self.out) and not os.environ.get("NO_COLOR")
        self.color = color
        self.mask = mask
        self.hold = hold  # bytes at the end of a cut long line that may begin a secret (LineSplitter)
        self.handle_signals = handle_signals and threading.current_thread() is threading.main_thread()
        self._events: queue.Queue[tuple[Event, Any]] = queue.Queue()
        self._write_lock = threading.Lock()
        self._stop_signal = 0
        self._logs: dict[str, Optional[TextIO]] = {}  # None: could not be written (reported once)
        self._log_dir_fd: Optional[int] = None  # --log-dir, opened and checked once: logs are made relative to it
        self.watch = hooks.watch
        self.watch_interval = watch_interval
        self._done = threading.Event()
        self.lost: Optional[str] = None
        # --hang-timeout (hangs.HangWatch.check): a text when no rank advanced for too long.
        self.hang_check = hang_check
        self.hang_interval = hang_interval
        self.hung: Optional[str] = None
        # --start-timeout: every rank's bootstrap says it started (wire.STARTED); not all of them
        # within this many seconds is a launch failure (a launcher that never gets the ranks going).
        self.start_timeout = start_timeout
        # For the summaries: hosts the collective check left out ("HOST (why)"), the script's results.
        self.left_out = list(left_out)
        self.results = results
        self._began = time.monotonic()  # the wall time's start (run() sets it again)
        self._expected = {r: h for p in self.procs for r, h in p.spec.rank_hosts.items()}
        self._started: set[int] = set()
        self.not_started: Optional[str] = None
        self._waiting: list[int] = []
        self._started_on: dict[int, str] = {}  # rank -> the host it said it started on (placement.py)
        self._rank_groups: dict[int, set[int]] = {}  # rank -> the process groups it led (wire.STARTED), for the sweep
        self._placed = False  # whether the placement was checked (once every rank said its host)
        self.sweep = hooks.sweep
        self.sessions = hooks.sessions
        self.starting = hooks.starting
        self.start_check = hooks.start_check
        self._swept_kill = False
        self._spawn_failed = False  # a process failed to start, or already exited non-zero
        self._unseen_reported: set = set()
        # --ranks / --local-ranks-filter: the console shows these ranks only; logs and tails keep all.
        self.console_ranks = None if console_ranks is None else frozenset(console_ranks)
        self._rewriting: set = set()  # ids of terminals whose current line holds a progress state

    # ---- output -------------------------------------------------------------------------------
    def _prefix(self, proc: _Proc, rank: Optional[int]) -> str:
        text = f"[rank {rank}]" if rank is not None else f"[{proc.spec.name}]"
        if self.color:
            color = _COLORS[(rank if rank is not None else proc.index) % len(_COLORS)]
            text = f"\x1b[{color}m{text}\x1b[0m"
        return text + " "

    def _pump(self, proc: _Proc, pipe, sink: TextIO) -> None:
        spec = proc.spec
        # A demuxer turns physical lines of a multi-rank process into (rank, line) pairs; it is
        # called with None at the end of the stream to flush what it holds.
        own = spec.rank if spec.ranks is None else None  # a multi-rank process without a demuxer
        if not proc.hooks.demux:
            self._pump_live(proc, own, pipe, sink)
            return
        demux = proc.hooks.demux()
        carry = b""  # the start of a secret a long line's cut split off: read again with the next piece
        for raw in iter(lambda: pipe.readline(LINE_READ_MAX), b""):
            raw, carry = carry + raw, b""
            if not raw.endswith(b"\n") and self.hold and len(raw) >= LINE_READ_MAX:
                kept = min(self.hold(raw), len(raw) // 2)
                raw, carry = raw[: len(raw) - kept], raw[len(raw) - kept :]
            for rank, text in demux(raw.decode("utf-8", errors="replace").rstrip("\r\n")):
                self._route(proc, rank, text, sink)
        if carry:
            for rank, text in demux(carry.decode("utf-8", errors="replace").rstrip("\r\n")):
                self._route(proc, rank, text, sink)
        for rank, text in demux(None):
            self._route(proc, rank, text, sink)
        pipe.close()

    def _route(self, proc: _Proc, rank: Optional[int], text: str, sink: TextIO) -> None:
        """A demuxed line: a progress state its rank's relay paced (relay.PROGRESS), or a finished line."""
        if text.startswith(PROGRESS):
            self._progress(proc, rank, text[len(PROGRESS) :], sink)
        else:
            self._emit(proc, rank, text, sink)

    def _pump_live(self, proc: _Proc, rank: Optional[int], pipe, sink: TextIO) -> None:
        """One rank's own pipe: lines as they end, and progress states (\r) as they come."""
        splitter = LineSplitter(LINE_READ_MAX, hold=self.hold)
        pace = None if _isatty(sink) else ProgressPace()  # a pipe or file: states as lines, a few
        fd = pipe.fileno()
        while True:
            wait = pace.wait(time.monotonic()) if pace else None
            try:
                if pace and wait is not None and not select.select([fd], [], [], wait)[0]:
                    self._progress(proc, rank, pace.due(time.monotonic()), sink)  # a stalled bar's state
                    continue
                data = os.read(fd, 65536)  # whatever has arrived: no waiting for a newline
            except (OSError, ValueError):
                break
            if not data:
                break
            for text, final in splitter.feed(data):
                if final:
                    if pace:
                        pace.done()
                    self._emit(proc, rank, text, sink)
                else:
                    self._progress(proc, rank, pace.offer(text, time.monotonic()) if pace else text, sink)
        for text, _ in splitter.close():
            self._emit(proc, rank, text, sink)
        pipe.close()

    def _progress(self, proc: _Proc, rank: Optional[int], text: Optional[str], sink: TextIO) -> None:
        """A progress state: rewrites its line on a terminal; elsewhere (paced by _pump_live) a line of its own.
        Logs keep only the finished line."""
        if text is None or (self.console_ranks is not None and rank is not None and rank not in self.console_ranks):
            return
        tty = _isatty(sink)
        with self._write_lock:
            try:
                if not tty:
                    sink.write(self._prefix(proc, rank) + self.mask(text)[:4000] + "\n")
                    sink.flush()
                    return
                sink.write("\r" + self._prefix(proc, rank) + self.mask(text)[:4000] + "\x1b[K")
                sink.flush()
                self._rewriting.add(id(sink))
            except (OSError, ValueError):
                pass

    def _log(self, log_dir: str, name: str, line: str) -> None:
        """Append to LOG_DIR/NAME.log (one file per rank); called with the write lock held.

        A log that cannot be written (disk full, a planted link) is reported once and dropped:
        the output goes on to the terminal and the job's exit status does not change."""
        path = os.path.join(log_dir, f"{name}.log")
        if name not in self._logs:
            try:
                self._logs[name] = (
                    open_log(f"{name}.log", self._log_dir_fd) if self._log_dir_fd is not None else open_log(path)
                )
            except OSError as exc:
                self._log_failed(name, path, exc)
        f = self._logs[name]
        if f is None:
            return
        try:
            f.write(line + "\n")
            f.flush()
        except (OSError, ValueError) as exc:
            self._log_failed(name, path, exc)

    def _log_failed(self, name: str, path: str, exc: Exception) -> None:
        old = self._logs.get(name)
        self._logs[name] = None
        if old is not None:
            try:
                old.close()
            except OSError:
                pass  # the unflushed rest fails again: already reported
        why = (
            "it is a symbolic link (not followed)"
            if getattr(exc, "errno", None) == errno.ELOOP
            else (getattr(exc, "strerror", None) or str(exc))
        )
        try:
            self.err.write(f"gaudi-launch: cannot write {path}: {why}; its output goes on to the terminal only\n")
            self.err.flush()
        except (OSError, ValueError):
            pass

    def _emit(self, proc: _Proc, rank: Optional[int], text: str, sink: TextIO) -> None:
        if text.startswith(STARTED):
            said = text[len(STARTED) :].split()  # the rank, then its host (wire.STARTED)
            own = rank if rank is not None else proc.spec.rank
            started = int(said[0]) if said and said[0].isdigit() else own
            with self._write_lock:
                self._started.add(started)
                if len(said) > 1:
                    self._started_on[started] = said[1]
                if len(said) > 2 and said[2].isdigit():  # each (re)start's group; bounded: the line is the rank's
                    led = self._rank_groups.setdefault(started, set())
                    if len(led) < RANK_GROUPS_KEEP:
                        led.add(int(said[2]))
                check = not self._placed and set(self._expected) <= set(self._started_on)
                self._placed = self._placed or check
            wrong = placement.misplaced(self._expected, self._started_on) if check else None
            if wrong:  # every rank said where it runs: not where the plan put it stops the job
                self._events.put((Event.MISPLACED, wrong))
            return
        if text.startswith(ERROR_MARKER):
            record = parse_record(text[len(ERROR_MARKER) :])
            if record is not None:
                with self._write_lock:
                    if len(proc.records) < RECORDS_KEEP:
                        proc.records.append(record)
                if proc.spec.ranks is not None:
                    self._events.put((Event.RANK_FAILED, proc.index))  # don't wait for the others
                return
        if proc.hooks.alarm is not None and proc.hooks.alarm(text):
            self._events.put((Event.RANK_FAILED, proc.index))
        line = self.mask(text)
        kept = _clip(line)
        with self._write_lock:
            proc.tail.append(kept)
            if rank is not None:
                proc.rank_tails.setdefault(rank, deque(maxlen=TAIL_KEEP)).append(kept)
            if self.log_dir:
                name = f"rank-{rank}" if rank is not None else proc.spec.name.replace(" ", "-")
                self._log(self.log_dir, name, line)
            if self.console_ranks is not None and rank is not None and rank not in self.console_ranks:
                return
            try:
                if id(sink) in self._rewriting:  # a progress state is on this line: replace it
                    self._rewriting.discard(id(sink))
                    sink.write("\r\x1b[K")
                sink.write(self._prefix(proc, rank) + line + "\n")
                sink.flush()
            except (OSError, ValueError):
                pass  # our own stdout is gone (closed pipe); keep draining the child

    # ---- lifecycle ----------------------------------------------------------------------------
    def _spawn(self, proc: _Proc) -> None:
        spec = proc.spec
        proc.started = time.monotonic()
        try:
            popen = subprocess.Popen(
                spec.argv,
                env=spec.env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            proc.tail.append(f"gaudi-launch could not start {spec.argv[0]!r}: {exc.strerror or exc}")
            proc.returncode = ExitCode.CANNOT_EXECUTE
            proc.ended = proc.started
            self._spawn_failed = True
            self._events.put((Event.EXITED, proc.index))
            return
        proc.popen, proc.state = popen, ProcState.RUNNING
        if self.sessions is not None:
            self.sessions.add(popen.pid)  # start_new_session: its session id is its pid
        for pipe, sink in ((popen.stdout, self.out), (popen.stderr, self.err)):
            t = threading.Thread(target=self._pump, args=(proc, pipe, sink), daemon=True)
            t.start()
            proc.readers.append(t)
        threading.Thread(target=self._wait, args=(proc, popen), daemon=True).start()

    def _wait(self, proc: _Proc, popen: subprocess.Popen) -> None:
        proc.returncode = popen.wait()
        self._spawn_failed = self._spawn_failed or proc.returncode != 0
        proc.ended = time.monotonic()
        self._events.put((Event.EXITED, proc.index))

    def _signal_groups(self, sig: int, only_running: bool = True) -> None:
        for proc in self.procs:
            if proc.popen is None or (only_running and proc.returncode is not None):
                continue
            if proc.hooks.stop is not None:
                proc.hooks.stop(sig)
                if sig != signal.SIGKILL:
                    continue
            try:
                os.killpg(proc.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _poll(self, interval: float, check: Callable[[], Optional[str]], event: Event) -> None:
        """Ask ``check`` every ``interval`` seconds until the job ends; its first message is the event."""
        while not self._done.wait(interval):
            message = check()
            if message:
                self._events.put((event, message))
                return

    def _kill_remaining(self) -> None:
        for proc in self.procs:
            if proc.popen is not None and proc.returncode is None:
                proc.killed = True
        self._signal_groups(signal.SIGKILL)
        if not self._swept_kill:
            self._swept_kill = True
            self._sweep(signal.SIGKILL)

    def _sweep(self, sig: int) -> int:
        """Run the job-id sweep; say once per process what it could not inspect. Processes hit."""
        if self.sweep is None:
            return 0

        hits = 0
        for host, found in sorted(self.sweep(sig, self._groups_by_host).items()):
            hits += max(found.hit, 0)
            new = [u for u in found.unseen if (host, u.split(" (")[0]) not in self._unseen_reported]
            self._unseen_reported.update((host, u.split(" (")[0]) for u in new)
            if new:
                try:
                    self.err.write(describe_unseen(host, new) + "\n")
                    self.err.flush()
                except (OSError, ValueError):
                    pass
        return hits

    def _groups_by_host(self) -> dict[str, set[int]]:
        """{host: the process groups its ranks led}, the host as the plan (or srun, once known) names it."""
        out: dict[str, set[int]] = {}
        with self._write_lock:
            for proc in self.procs:
                for rank, host in list(proc.spec.rank_hosts.items()):
                    if host and rank in self._rank_groups:
                        out.setdefault(host, set()).update(self._rank_groups[rank])
        return out

    def _final_sweep(self) -> None:
        """After every process we started is reaped: whatever still carries the job's id goes too,
        SIGTERM first, SIGKILL once the grace period is over."""
        if self.sweep is None or not self._sweep(signal.SIGTERM):
            return
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and self._sweep(0):
            time.sleep(0.2)
        self._sweep(signal.SIGKILL)

    def _watch_start(self, deadline: float) -> None:
        """The start-up deadline: not every rank started by then is the event "not started"."""
        while not self._done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            with self._write_lock:
                waiting = sorted(set(self._expected) - self._started)
                started = sorted(self._started & set(self._expected))
            if not waiting:
                return
            if time.monotonic() >= deadline:
                self._events.put((Event.NOT_STARTED, (waiting, started)))
                return

    def _check_start(self) -> None:
        """Hooks.start_check, every START_CHECK_S until every rank started: its message is the event
        "start failed"."""
        check = self.start_check
        assert check is not None  # (run() starts this thread only with one)
        while not self._done.wait(START_CHECK_S):
            with self._write_lock:
                if set(self._expected) <= self._started:
                    return
                hosts = {self._expected[r] for r in self._started if r in self._expected}
            message = check(hosts)
            if message:
                self._events.put((Event.START_FAILED, message))
                return

    def _not_started_message(self, waiting: list[int], started: list[int]) -> str:
        hosts = sorted({self._expected[r] for r in waiting if self._expected[r]})
        did = f" ({rank_words(started)})" if started else ""
        return (
            f"not every rank started within {self.start_timeout:g} s (--start-timeout): {len(started)} of "
            f"{len(self._expected)} did{did}; not started: {rank_words(waiting)}"
            + (f" on {', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}" if hosts else "")
            + (f"; {why}" if self.starting is not None and (why := self.starting()) else "")
        )

    def _on_signal(self, signum, _frame) -> None:
        self._stop_signal = signum
        self._events.put((Event.SIGNAL, signum))

    def run(self) -> JobResult:
        self._began = time.monotonic()
        if self.log_dir:
            self._log_dir_fd = open_log_dir(self.log_dir)
        old_handlers = {}
        if self.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        if self.watch is not None:
            threading.Thread(
                target=self._poll, args=(self.watch_interval, self.watch, Event.HOST_LOST), daemon=True
            ).start()
        if self.hang_check is not None:
            threading.Thread(
                target=self._poll, args=(self.hang_interval, self.hang_check, Event.HUNG), daemon=True
            ).start()
        if self.start_timeout:
            threading.Thread(
                target=self._watch_start, args=(time.monotonic() + self.start_timeout,), daemon=True
            ).start()
        if self.start_check is not None:
            threading.Thread(target=self._check_start, daemon=True).start()
        try:
            return self._run()
        finally:
            self._done.set()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            for f in self._logs.values():
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass  # reported when the write failed
            if self._log_dir_fd is not None:
                os.close(self._log_dir_fd)
                self._log_dir_fd = None

    def _run(self) -> JobResult:
        first: Optional[_Proc] = None
        interrupted: Optional[str] = None
        deadline: Optional[float] = None  # set once teardown starts

        def teardown() -> None:
            nonlocal deadline
            if deadline is None:
                deadline = time.monotonic() + self.grace
                for p in self.procs:
                    if p.state == ProcState.RUNNING and p.returncode is None:
                        p.state = ProcState.TORN_DOWN
                self._signal_groups(signal.SIGTERM)
                self._sweep(signal.SIGTERM)

        for proc in self.procs:
            # A signal or a failure while spawning: start nothing more (the main loop tears down).
            if self._stop_signal or self._spawn_failed:  # (a flag: a scan per spawn is quadratic in ranks)
                break
            self._spawn(proc)
        pending = {p.index for p in self.procs if p.popen is not None or p.returncode is not None}
        while pending:
            now = time.monotonic()
            timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
            if deadline is not None and now >= deadline:
                self._kill_remaining()  # past the grace period (again each turn: harmless)
            try:
                kind, value = self._events.get(timeout=timeout)
            except queue.Empty:
                continue
            if kind is Event.RANK_FAILED:
                proc = self.procs[value]
                if proc.state == ProcState.RUNNING:
                    proc.state = ProcState.FAILED
                    if first is None and interrupted is None and self.lost is None:
                        first = proc
                    teardown()
                continue
            if kind is Event.HOST_LOST:
                if first is None and interrupted is None and self.lost is None and self.hung is None:
                    self.lost = value
                teardown()
                continue
            if kind is Event.HUNG:
                if first is None and interrupted is None and self.lost is None and deadline is None:
                    self.hung = value
                    teardown()
                continue
            if kind in (Event.MISPLACED, Event.START_FAILED):  # a launch failure, like ranks that did not start
                if first is None and interrupted is None and self.lost is None and deadline is None:
                    self.not_started = value
                    teardown()
                continue
            if kind is Event.NOT_STARTED:
                if first is None and interrupted is None and self.lost is None and deadline is None:
                    self._waiting = value[0]
                    self.not_started = self._not_started_message(*value)
                    teardown()
                continue
            if kind is Event.SIGNAL:
                if deadline is not None:
                    self._kill_remaining()  # a signal during teardown: no more waiting
                interrupted = interrupted or signal_name(value)
                teardown()
                continue
            proc = self.procs[value]  # Event.EXITED
            pending.discard(value)
            if proc.returncode == 0:
                if proc.state == ProcState.RUNNING:
                    proc.state = ProcState.OK
            elif proc.state == ProcState.RUNNING or (proc.state == ProcState.NOT_STARTED and proc.popen is None):
                # (a process already marked failed by a rank's record keeps that verdict)
                proc.state = ProcState.FAILED
                if first is None and interrupted is None:
                    first = proc
                teardown()
        if self._stop_signal and interrupted is None and first is None:
            interrupted = signal_name(self._stop_signal)  # arrived before anything was running
        # Every direct child is reaped; kill whatever their process groups left behind.
        self._signal_groups(signal.SIGKILL, only_running=False)
        self._final_sweep()
        for proc in self.procs:
            for t in proc.readers:
                t.join(timeout=5)
        return self._result(first, interrupted)

    def _result(self, first: Optional[_Proc], interrupted: Optional[str]) -> JobResult:
        now = time.monotonic()
        results = [
            ProcResult(
                rank=p.spec.rank,
                host=p.spec.host,
                name=p.spec.name,
                pid=p.popen.pid if p.popen else None,
                returncode=p.returncode,
                state=p.state,
                runtime_s=((p.ended or now) - p.started) if p.started else 0.0,
                tail=list(p.tail),
                killed=p.killed,
                rank_tails={r: list(t) for r, t in p.rank_tails.items()},
                records=list(p.records),
                rank_hosts=p.spec.rank_hosts,
                explain=p.hooks.explain,
                launcher=p.spec.ranks is not None,
                started=sorted(self._started & set(p.spec.rank_hosts)),
            )
            for p in self.procs
        ]
        first_result = results[first.index] if first else None
        culprit = find_culprit(first_result) if first_result else None
        code = job_exit_code(
            first_result,
            culprit,
            lost=self.lost,
            hung=self.hung,
            not_started=self.not_started,
            interrupted=interrupted,
        )
        if code != 0:
            summary = format_summary(
                first_result,
                culprit,
                results,
                interrupted,
                code,
                self.log_dir,
                lost=self.lost,
                hung=self.hung,
                not_started=self.not_started,
                waiting=self._waiting,
                left_out=self.left_out,
            )
        else:
            hosts = set(self._expected.values())
            summary = format_success(
                len(self._expected),
                None if "" in hosts else len(hosts),
                now - self._began,
                self.log_dir,
                results=self.results,
                left_out=self.left_out,
            )
        summary = self.mask(summary)
        try:
            self.err.write(summary)
            self.err.flush()
        except (OSError, ValueError):
            pass
        return JobResult(
            exit_code=code,
            procs=results,
            first_failure=first_result,
            culprit=culprit,
            interrupted_by=interrupted,
            summary=summary,
            hung=self.hung,
            lost=self.lost,
            not_started=self.not_started,
        )


def _clip(line: str) -> str:
    if len(line) <= TAIL_LINE_CHARS:
        return line
    return line[:TAIL_LINE_CHARS] + f" ... [{len(line) - TAIL_LINE_CHARS} more characters]"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def supervise_job(plan: LaunchPlan, procs: list[ProcSpec], hooks: Hooks = NO_HOOKS, **options) -> JobResult:
    """The one way a backend runs its processes: under the supervisor, with its hooks and the job's own
    settings from the plan (--grace, --log-dir, --ranks, secrets masked, what the summaries repeat).
    ``options``: the caller's (streams, --hang-timeout's check, the start-up deadline)."""
    spec = plan.job
    return Supervisor(
        procs,
        hooks,
        grace=spec.grace,
        log_dir=spec.log_dir,
        console_ranks=spec.console_ranks,
        mask=plan.mask,
        hold=plan.secret_tail,
        left_out=plan.left_out,
        results=output_dir(plan.program),
        **options,
    ).run()
