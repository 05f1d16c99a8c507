"""Restarts for long runs (``--max-restarts N``): a failed job is torn down and started again.

Each attempt is a whole new job (fresh plan: a new job id, a free port, the pre-flight again), so
nothing of a broken attempt survives into the next. The ranks learn which attempt they are from
GAUDI_LAUNCH_RESTART_COUNT and torchrun's TORCHELASTIC_RESTART_COUNT (0 on the first), and our
Trainer resumes from the newest complete checkpoint when it is above 0. A stop the user asked for
(Ctrl-C, a scheduler's SIGTERM) never restarts; bad input and a failed pre-flight never start a job
in the first place. The decisions are pure functions; ``run_job`` is the thin loop around them.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode, for_signal
from gaudi_launch.inputs.restartopts import Cause, parse_restart_on
from gaudi_launch.process.attempts import attempt_spec
from gaudi_launch.process.hangs import HangWatch, check_watchable
from gaudi_launch.wire import HEARTBEAT_DIR

if TYPE_CHECKING:  # types only
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.plan.launchplan import LaunchPlan
    from gaudi_launch.process.supervise import JobResult


BACKOFF_CAP_S = 60.0  # doubling back-off never waits longer than this
_CAUSE_WORDS = {Cause.RANK: "rank failure", Cause.HOST: "host lost", Cause.HANG: "hang"}


def lost_hosts_in(message: Optional[str], hosts: Sequence[str]) -> list[str]:
    """The hosts a lost-host message (watch.py: 'host NAME stopped answering ...') names. Pure."""
    return [h for h in hosts if message and message.startswith(f"host {h} ")]


def backoff_s(restart: int, base: float, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): base, 2*base, 4*base... Pure."""
    return min(cap, base * (2 ** max(0, restart - 1)))


def failure_cause(result) -> Optional[Cause]:
    """'rank', 'host' or 'hang' for a failed job; None when it succeeded or was stopped on
    purpose (a signal to the launcher), which never restarts. Pure."""
    if result.ok or result.interrupted_by:
        return None
    if getattr(result, "hung", None):
        return Cause.HANG
    if result.first_failure is None and result.exit_code == ExitCode.HOST_LOST:
        return Cause.HOST
    return Cause.RANK


def should_restart(result, restarts_done: int, max_restarts: int, restart_on: frozenset[Cause]) -> bool:
    cause = failure_cause(result)
    return cause is not None and cause in restart_on and restarts_done < max_restarts


@dataclass
class Attempt:
    number: int  # 1-based, as printed
    exit_code: int
    cause: Optional[Cause]  # None: it succeeded (or was stopped)
    culprit: Optional[str]  # "rank 1 on host-a", or the lost host's message
    status: str  # "exit code 9", "killed by SIGKILL", ...
    runtime_s: float
    backoff_s: float = 0.0  # waited after it, before the next attempt


def describe(result, number: int, runtime_s: float) -> Attempt:
    """What one attempt amounted to, from its JobResult. Pure."""
    cause = failure_cause(result)
    culprit, status = None, f"exit code {result.exit_code}"
    if result.culprit is not None:
        who = f"rank {result.culprit.rank}" if result.culprit.rank is not None else result.first_failure.name
        culprit, status = f"{who} on {result.culprit.host}", result.culprit.status
    elif getattr(result, "hung", None):
        culprit = result.hung.splitlines()[0]
    elif getattr(result, "lost", None):
        culprit = result.lost
    elif getattr(result, "not_started", None):
        culprit = result.not_started
    elif result.interrupted_by:
        status = f"stopped by {result.interrupted_by}"
    return Attempt(number, result.exit_code, cause, culprit, status, runtime_s)


def format_attempts(attempts: list[Attempt], max_restarts: int, exit_code: int) -> str:
    """The per-attempt summary printed at the end of a job that had restarts enabled. Pure."""
    lines = ["", f" gaudi-launch: {len(attempts)} attempt(s), up to {max_restarts} restart(s) ".center(74, "=")]
    for a in attempts:
        if a.exit_code == 0:
            what = "finished"
        elif a.cause is None:
            what = a.status
        else:
            what = f"{_CAUSE_WORDS[a.cause]}: {a.culprit or '?'}, {a.status}"
        tail = f" (then {a.backoff_s:g} s back-off)" if a.backoff_s else ""
        lines.append(f"attempt {a.number}: {what} after {a.runtime_s:.1f} s{tail}")
    failed = [a for a in attempts if a.exit_code != 0]
    if failed:
        lost = sum(a.runtime_s + a.backoff_s for a in failed)
        lines.append(
            f"time lost: {lost:.1f} s in failed attempts and back-off (the work since each one's "
            "last checkpoint is redone)"
        )
    lines.append(f"exit code: {exit_code}")
    lines.append("=" * 74)
    return "\n".join(lines) + "\n"


def _wait(seconds: float, announce: Callable[[], None]) -> Optional[int]:
    """Announce the back-off and sleep through it; a SIGINT/SIGTERM/SIGHUP ends it and is returned
    (no restart then). The handlers are in place before the announcement: whoever reacts to it by
    stopping the launcher must not find the default action, which would skip the clean-up."""
    if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
        announce()
        time.sleep(seconds)
        return None
    got: list[int] = []
    done = threading.Event()

    def stop(signum, _frame):
        got.append(signum)
        done.set()

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        announce()
        done.wait(max(0.0, seconds))
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return got[0] if got else None


def run_job(
    spec: JobSpec,
    first_plan: LaunchPlan,
    *,
    build: Callable[[JobSpec], LaunchPlan],
    start: Callable[..., JobResult],
    err: Optional[TextIO] = None,
    wait: Callable[[float, Callable[[], None]], Optional[int]] = _wait,
    clock: Callable[[], float] = time.monotonic,
) -> JobResult:
    """Run the job, and again after a failure while --max-restarts allows; the last JobResult.

    ``build(spec) -> plan`` plans a later attempt (the first plan is given: it was shown or checked
    already); ``start(plan, **supervisor_options) -> JobResult`` runs one attempt (plan.job is its spec) through its
    backend. With --hang-timeout the job's heartbeat directory lives as long as this call.
    """
    err = err or sys.stderr
    watch = None
    if spec.hang_timeout:
        check_watchable(first_plan)
        watch = HangWatch(spec.hang_timeout, spec.env[HEARTBEAT_DIR], spec.log_dir)
        watch.create()
    try:
        return _attempts(spec, first_plan, build, start, err, wait, clock, watch)
    finally:
        if watch is not None:
            watch.close()


def _attempts(
    spec: JobSpec,
    plan: LaunchPlan,
    build: Callable[[JobSpec], LaunchPlan],
    start: Callable[..., JobResult],
    err: TextIO,
    wait: Callable[[float, Callable[[], None]], Optional[int]],
    clock: Callable[[], float],
    watch: Optional[HangWatch],
) -> JobResult:
    restart_on = parse_restart_on(spec.restart_on)
    attempts: list[Attempt] = []
    lost: list[str] = list(spec.lost_hosts)
    current = attempt_spec(spec, 0, lost)
    while True:
        options = {}
        if watch is not None:
            watch.begin(plan.world_size, plan.job_id)
            options = dict(hang_check=watch.check, hang_interval=watch.interval)
        began = clock()
        try:
            result = start(plan, **options)
        except UserError as exc:  # a pre-flight failed inside its attempt (the one-pass tree's, remote/onepass.py)
            if attempts:  # as when a restart's plan fails: the attempts so far, then the error
                _say(err, format_attempts(attempts, spec.max_restarts, exc.exit_code).rstrip("\n"))
            raise
        attempts.append(describe(result, len(attempts) + 1, clock() - began))
        cause = attempts[-1].cause
        if cause is None or not should_restart(result, len(attempts) - 1, spec.max_restarts, restart_on):
            break
        restart = len(attempts)
        attempts[-1].backoff_s = backoff_s(restart, spec.restart_backoff)
        message = (
            f"gaudi-launch: attempt {restart} failed ({_CAUSE_WORDS[cause]}); restart "
            f"{restart} of {spec.max_restarts} in {attempts[-1].backoff_s:g} s"
        )
        signum = wait(attempts[-1].backoff_s, lambda: _say(err, message))
        if signum is not None:
            _say(err, f"gaudi-launch: received {signal.Signals(signum).name} during the back-off: no restart")
            result = dataclasses.replace(
                result, exit_code=for_signal(signum), interrupted_by=signal.Signals(signum).name
            )
            break
        if cause == Cause.HOST:  # left out from now on (a spare, if any, takes its place)
            lost += [h for h in lost_hosts_in(result.lost, [n.host for n in plan.nodes]) if h not in lost]
        current = attempt_spec(spec, restart, lost)
        try:
            plan = dataclasses.replace(build(current), left_out=plan.left_out)  # the job's, not an attempt's
        except UserError as exc:  # e.g. the pre-flight of a host that is gone for good
            _say(err, format_attempts(attempts, spec.max_restarts, exc.exit_code).rstrip("\n"))
            raise
    if spec.max_restarts and (len(attempts) > 1 or not result.ok):
        _say(err, format_attempts(attempts, spec.max_restarts, result.exit_code).rstrip("\n"))
    return result


def _say(err: TextIO, text: str) -> None:
    try:
        err.write(text + "\n")
        err.flush()
    except (OSError, ValueError):
        pass
