"""One way to run a job through its backend, for the command line (launch.py), DistributedRunner (runner.py) and
the collective check (collective.py) alike: spec -> plan -> attempts.

``prepare`` puts what every attempt shares into the spec (restart count, heartbeat directory);
``plan_job`` builds the plan with the pre-flight (waiting for the hosts first with --wait-hosts);
``launch`` runs it through its backend, again after a failure while --max-restarts allows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

from gaudi_launch.backends import get_backend
from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.plan.shared import ENV_FILES_NOTE
from gaudi_launch.process.attempts import first_attempt
from gaudi_launch.process.logfiles import prepare_log_dir
from gaudi_launch.process.restarts import run_job

if TYPE_CHECKING:  # types only
    from gaudi_launch.process.supervise import JobResult


def start_timeout_for(spec: JobSpec, backend: str) -> Optional[float]:
    """The start-up deadline of one attempt: --start-timeout, else the backend's default (900 s; none with
    srun, whose wait in the queue for an allocation has no bound of ours); none for 0. Pure."""
    if spec.start_timeout is None:
        return capabilities(backend).start_timeout
    return spec.start_timeout or None


def prepare(spec: JobSpec) -> JobSpec:
    """The spec of the first attempt. Idempotent."""
    return first_attempt(spec)


def preflight_for(spec: JobSpec, *, in_one_pass: bool = False) -> Callable:
    """The pre-flight this job runs: the SSH checks, after --wait-hosts' wait when given; ``in_one_pass``:
    left to the job's own ranks where the job goes through the tree in one pass (onepass.deferring)."""

    def preflight(plan: LaunchPlan, job: JobSpec):
        # Its modules (fan-out, probe, tree, one pass) load when a plan has hosts to check, which is when
        # build_plan calls this: a one-host dry run never imports them (issue 37, the start-up budget).
        from gaudi_launch.remote import hostchecks, hostwait, onepass

        check = hostchecks.default_preflight
        if spec.wait_hosts:
            check = hostwait.before(check, spec.wait_hosts)
        return (onepass.deferring(check) if in_one_pass else check)(plan, job)

    return preflight


def plan_job(spec: JobSpec, *, keep_failed_preflight: bool = False) -> LaunchPlan:
    """The plan of a prepared spec, pre-flight included (a failed one raises, unless kept for a dry run)."""
    # a real run goes through the tree in one pass where it can: the job's ranks run the checks
    preflight = preflight_for(spec, in_one_pass=not keep_failed_preflight)
    return build_plan(spec, preflight=preflight, keep_failed_preflight=keep_failed_preflight, backends=get_backend)


def launch(
    spec: JobSpec,
    plan: Optional[LaunchPlan] = None,
    *,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
    announce: bool = False,
) -> JobResult:
    """Run the job (``plan``: its first plan, already shown or checked) and return the last attempt's
    result. ``announce``: one line per attempt saying what starts where (the CLI's)."""
    spec = prepare(spec)
    if spec.log_dir:  # refused before the job is announced, not after
        prepare_log_dir(spec.log_dir)
    streams: dict[str, Any] = {k: v for k, v in (("stdout", stdout), ("stderr", stderr)) if v is not None}

    def start(p: LaunchPlan, **supervisor_options) -> JobResult:
        if announce:
            print(
                f"gaudi-launch: job {p.job_id}: {p.world_size} rank(s) on {len(p.nodes)} host(s), backend "
                f"{p.backend}, master {p.master_addr}:{p.master_port}",
                file=stderr or sys.stderr,
                flush=True,
            )
        supervisor_options.setdefault("start_timeout", start_timeout_for(p.job, p.backend))
        return get_backend(p.backend).run(p, **streams, **supervisor_options)

    first = plan if plan is not None else plan_job(spec)
    for note in first.notes:  # every run (the CLI's, DistributedRunner's) says which env files it read
        if note.startswith(ENV_FILES_NOTE):
            print(f"gaudi-launch: {note}", file=stderr or sys.stderr, flush=True)
    return run_job(spec, first, build=plan_job, start=start, err=stderr)
