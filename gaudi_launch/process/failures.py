"""A job's failures: which rank failed first, and the summary that says so, root cause first (and the
short summary of a job that ended well, in the same frame).

The supervisor (supervise.py) runs the processes and hands what it saw here: each process's result
(ProcResult: exit status, output tail, the error records its ranks wrote, gaudi_launch/wire.py). The
decisions are pure functions of those results, as torch elastic's errors module decides from its
ProcessFailures: the culprit is the first failing process's first error record (arrival order; the
records' times have whole seconds only), else what its launcher said (``explain``), else its own
exit; the job's exit code is that rank's own; the summary names it with its traceback, then what
else failed, what was torn down as a consequence and what never started.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

from gaudi_launch.exitcodes import ExitCode, for_signal
from gaudi_launch.inputs.idranges import rank_words

SUMMARY_LINES = 25  # lines shown when there is no traceback
TRACEBACK_LINES = 60  # at most this much of a traceback
LEFT_OUT = "left out by the collective check: "


@dataclass
class Culprit:
    """The rank that failed first, as far as anyone can tell."""

    rank: Optional[int]
    host: str
    status: str
    excerpt: list[str]
    exit_code: Optional[int] = None  # its own code, when its launcher returns another (srun: 143)


class ProcState(str, enum.Enum):
    """Where a process is: not started, then running, then ok, failed or torn down (stopped by us
    because of another's failure or a signal to the launcher)."""

    NOT_STARTED = "not started"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TORN_DOWN = "torn down"

    def __str__(self) -> str:
        return self.value


@dataclass
class ProcResult:
    rank: int
    host: str
    name: str
    pid: Optional[int]
    returncode: Optional[int]  # Popen convention: -N means killed by signal N
    state: ProcState  # how it ended: ok, failed, torn down or not started
    runtime_s: float
    tail: list[str] = field(default_factory=list)  # all output lines, in order
    killed: bool = False  # needed SIGKILL after the grace period
    rank_tails: dict[int, list[str]] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)  # workers' error records, in arrival order
    rank_hosts: dict[int, str] = field(default_factory=dict)
    explain: Optional[Callable[[list[str]], Optional[Culprit]]] = None
    launcher: bool = False  # it started ranks (mpirun, deepspeed), even a single one
    started: Optional[list[int]] = None  # its ranks whose bootstrap said it started (wire.STARTED)

    def __post_init__(self):
        self.rank_hosts = self.rank_hosts or {self.rank: self.host}

    @property
    def status(self) -> str:
        return describe_returncode(self.returncode)


def exit_code_for(returncode: int) -> int:
    """Shell convention: a signal N becomes 128+N."""
    return for_signal(-returncode) if returncode < 0 else returncode


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: Optional[int]) -> str:
    if returncode is None:
        return "not started"
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit code {returncode}"


def failure_excerpt(tail: list[str]) -> list[str]:
    """The Python traceback at the end of the output when there is one, else the last lines."""
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].startswith("Traceback (most recent call last)"):
            return tail[i:][-TRACEBACK_LINES:]
    return tail[-SUMMARY_LINES:]


def find_culprit(first: ProcResult) -> Culprit:
    """Which rank of the first failing process failed, from the best evidence there is. Pure."""
    if first.records:
        rec = first.records[0]
        rank = rec.get("rank")
        if not isinstance(rank, int):
            rank = first.rank
        status = f"killed by {rec['signal']}" if rec.get("signal") else f"exit code {rec.get('exit_code')}"
        if len(first.rank_hosts) == 1 and not first.launcher and first.returncode is not None:
            status = first.status
        if rec.get("exc_type"):
            status += f" ({rec['exc_type']}: {rec.get('message', '')})"
        if rec.get("traceback"):
            excerpt = str(rec["traceback"]).rstrip("\n").splitlines()[-TRACEBACK_LINES:]
        else:
            excerpt = failure_excerpt(first.rank_tails.get(rank) or first.tail)
        host = first.rank_hosts.get(rank) or rec.get("host") or first.host
        return Culprit(rank, host, status, excerpt)
    if first.explain is not None:
        found = first.explain(first.tail)
        if found is not None:
            if not found.excerpt:
                tail = first.rank_tails.get(found.rank) if found.rank is not None else None
                found.excerpt = failure_excerpt(tail or first.tail)
            return found
    if first.launcher and first.started == []:  # it failed before any of its ranks started: its own failure
        return Culprit(None, first.host, first.status + " (before any rank started)", failure_excerpt(first.tail))
    return Culprit(
        first.rank, first.host, first.status, failure_excerpt(first.rank_tails.get(first.rank) or first.tail)
    )


def format_summary(
    first: Optional[ProcResult],
    culprit: Optional[Culprit],
    procs: list[ProcResult],
    interrupted_by: Optional[str],
    exit_code: int,
    log_dir: Optional[str],
    lost: Optional[str] = None,
    hung: Optional[str] = None,
    not_started: Optional[str] = None,
    waiting: Sequence[int] = (),
    left_out: Sequence[str] = (),
) -> str:
    """One failure summary, root cause first. Pure: built from results only. ``not_started``: the
    start-up deadline's message, ``waiting`` the ranks it names; ``left_out``: the hosts the collective
    check left out, "HOST (why)" each."""
    # Ctrl-C or a scheduler's SIGTERM with every rank still healthy: the job was stopped, not broken.
    title = (
        " gaudi-launch: job interrupted "
        if interrupted_by and first is None and not (lost or hung or not_started)
        else " gaudi-launch: job hung "
        if hung and first is None
        else " gaudi-launch: launch failed "
        if not_started and first is None
        else " gaudi-launch: job failed "
    )
    lines = ["", title.center(74, "=")]
    if lost and first is None:
        lines.append(f"first failure: {lost}")
    if hung and first is None and not lost:
        lines.append(f"first failure: {hung}")
    if not_started and first is None and not (lost or hung):
        lines.append(f"first failure: {not_started}")
        # what was seen: the last output of whatever was to start them (mpirun, srun, a rank's process)
        seen = next((p for p in procs if set(p.rank_hosts) & set(waiting) and p.tail), None)
        if seen is not None:
            lines.append(f"last output of {seen.name}:")
            lines.extend("  | " + line for line in seen.tail[-SUMMARY_LINES:])
        else:
            lines.append("nothing was printed by what was to start them")
    if first is not None and culprit is not None:
        who = f"rank {culprit.rank}" if culprit.rank is not None else first.name
        through = len(first.rank_hosts) > 1 and culprit.rank is not None
        via = f" (through {first.name}, pid {first.pid})" if through else f" (pid {first.pid})"
        lines.append(f"first failure: {who} on {culprit.host}{via}, {culprit.status} after {first.runtime_s:.1f} s")
        if culprit.excerpt:
            lines.append(f"last output of {who}:")
            lines.extend("  | " + line for line in culprit.excerpt)
        else:
            lines.append(f"{who} printed nothing")
    if interrupted_by:
        lines.append(f"the launcher received {interrupted_by} and stopped the job")
    also = [p.name + f" ({p.status})" for p in procs if p.state == ProcState.FAILED and p is not first]
    if first is not None:
        also += [f"rank {r['rank']}" for r in first.records[1:] if isinstance(r.get("rank"), int)]
    if also:
        lines.append("also failed: " + ", ".join(also))
    torn = [
        f"{p.name} ({'SIGKILL after grace period' if p.killed else p.status})"
        for p in procs
        if p.state == ProcState.TORN_DOWN
    ]
    never = [p.name for p in procs if p.state == ProcState.NOT_STARTED]
    if first is not None and len(first.rank_hosts) > 1:
        failed = {r.get("rank") for r in first.records} | {culprit.rank if culprit else None}
        rest = [r for r in sorted(first.rank_hosts) if r not in failed]
        if rest and first.started == [] and culprit is not None and culprit.rank is None:
            never.append(rank_words(rest))  # its launcher failed first
        elif rest:
            torn.append(", ".join(f"rank {r}" for r in rest) + f" (stopped by {first.name})")
    if torn:
        lines.append("torn down as a consequence: " + ", ".join(torn))
    if never:
        lines.append("never started: " + ", ".join(never))
    lines.extend(LEFT_OUT + host for host in left_out)
    if log_dir:
        lines.append(f"per-rank logs: {log_dir}")
    lines.append(f"exit code: {exit_code}")
    lines.append("=" * 74)
    return "\n".join(lines) + "\n"


def format_success(
    ranks: int,
    hosts: Optional[int],
    wall_s: float,
    log_dir: Optional[str],
    results: Optional[str] = None,
    left_out: Sequence[str] = (),
) -> str:
    """The summary of a job that ended well, in the failure summary's frame: how many ranks where, how
    long, what the collective check left out, where the per-rank logs and the script's results are.
    ``hosts``: None when not every rank's host is known (srun placed them). Pure."""
    where = f" on {hosts} host(s)" if hosts else ""
    lines = ["", " gaudi-launch: job done ".center(74, "=")]
    lines.append(f"all {ranks} rank(s){where} ended well, wall time {duration(wall_s)}")
    lines.extend(LEFT_OUT + host for host in left_out)
    lines.append(f"per-rank logs: {log_dir}" if log_dir else "per-rank logs: not kept (--log-dir DIR keeps them)")
    if results:
        lines.append(f"results: {results} (the script's --output_dir)")
    lines.append("exit code: 0")
    lines.append("=" * 74)
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    """12.3 s, or 1:02:05 (3725 s) past a minute. Pure."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d} ({whole} s)"


def output_dir(program: Sequence[str]) -> Optional[str]:
    """Where the script writes its results when its arguments say: --output_dir (the Trainer's and
    Hugging Face's examples' spelling) or --output-dir, the last one given, as argparse takes it. Pure."""
    found = None
    for i, arg in enumerate(program):
        for flag in ("--output_dir", "--output-dir"):
            if arg == flag and i + 1 < len(program):
                found = program[i + 1]
            elif arg.startswith(flag + "="):
                found = arg[len(flag) + 1 :]
    return found


def job_exit_code(
    first: Optional[ProcResult],
    culprit: Optional[Culprit],
    *,
    lost: Optional[str] = None,
    hung: Optional[str] = None,
    not_started: Optional[str] = None,
    interrupted: Optional[str] = None,
) -> int:
    """The job's exit code: the failing rank's own (not its launcher's), else what stopped the job. Pure."""
    if first is not None:
        # A failing process's returncode is set: the supervisor waits until every started one exited.
        assert first.returncode is not None
        code = exit_code_for(first.returncode)
        record_code = first.records[0].get("exit_code") if first.records else None
        if (len(first.rank_hosts) > 1 or first.launcher) and isinstance(record_code, int) and record_code:
            return record_code  # the failing rank's own code, not its launcher's
        if culprit is not None and culprit.exit_code:
            return culprit.exit_code
        return code
    if lost:
        return ExitCode.HOST_LOST
    if hung:
        return ExitCode.HUNG
    if not_started:
        return ExitCode.CANNOT_EXECUTE  # the ranks could not be started
    if interrupted:
        return for_signal(signal.Signals[interrupted])
    return 0
