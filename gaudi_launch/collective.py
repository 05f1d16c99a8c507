"""Prove the fabric before the job (issue 25): `check --collective` and `--collective-check`.

The test is a job of its own: one rank per host (the job's hosts and its spares), started by the job's
backend (local, mpirun, deepspeed) with the job's interface, interpreter and environment, running
gaudi_launch.runtime.collective_check with the device's library (hccl, nccl or gloo). This process only
reads the ranks' marker lines (it never imports torch) and judges them (reports/collective.py).
Time is bounded twice: each step by the ranks' process-group timeout, the whole by a deadline here after
which the check job is torn down like an interrupted job, its silent hosts named failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import tempfile
import threading
import time
from typing import Optional

from gaudi_launch.backends import get_backend
from gaudi_launch.backends.job import launch, plan_job
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.backend_options import SlurmOptions
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.process.failures import LEFT_OUT
from gaudi_launch.process.logfiles import prepare_log_dir
from gaudi_launch.remote import sshmux
from gaudi_launch.reports.collective import MARKER, CollectiveReport, judge, parse
from gaudi_launch.wire import COLLECTIVE, COLLECTIVE_LIBRARY, COLLECTIVE_STEP_TIMEOUT

RANK_MODULE = "gaudi_launch.runtime.link_check"  # the torch-free stage; it runs collective_check when needed
SETTINGS_VAR = COLLECTIVE  # runtime/collective_check.SETTINGS
MESSAGE_BYTES = 4 << 20  # a few MB: past the latency-bound regime, still well under a second per round
ROUNDS = 5  # after a warm-up; every rank runs the same count (a rank-local rule could deadlock)
# Per collective step (the process group's timeout, also the ranks' rendezvous); the variable is for a
# fabric known to be slow, and for the tests.
STEP_TIMEOUT_S = float(os.environ.get(COLLECTIVE_STEP_TIMEOUT, "30"))
START_TIMEOUT_S = 60.0  # every rank started (torch imported) on a busy machine
RESULT_FILE = "collective-check.json"
JOB_OUTPUT_LINES = 20  # of the check job's own output, shown when a rank said nothing


class CollectiveCheckFailed(UserError):
    exit_code = ExitCode.PREFLIGHT

    def __init__(self, report: CollectiveReport, written: Optional[str] = None, extra: str = ""):
        text = report.verdict() or "collective check failed"
        head, _, hint = text.partition("\n  hint: ")
        body = head + "\n" + report.render_table()
        if written:
            body += f"\nfindings written to {written} (--exclude-from reads it)"
        super().__init__(body + extra, hint=hint or None)
        self.report = report


def check_hosts_of(plan: LaunchPlan) -> list[str]:
    """The hosts to measure: the job's, then its spares (a spare must be fit to take a place)."""
    hosts = [n.host for n in plan.nodes]
    return hosts + [h for h in plan.spares if h not in hosts]


def check_spec(spec: JobSpec, hosts: list[str], hostfile: str) -> JobSpec:
    """The check job: the user's job with its program, one rank per host, no restarts and no log dir. Pure."""
    settings = f"{MESSAGE_BYTES},{ROUNDS},{STEP_TIMEOUT_S:g}"
    library = {COLLECTIVE_LIBRARY: "1"} if os.environ.get(COLLECTIVE_LIBRARY) == "1" else {}  # gloo on a CPU too
    return dataclasses.replace(
        spec,
        program=[RANK_MODULE],
        module=True,
        no_python=False,
        append_local_rank=False,
        hostfile=hostfile,
        include=None,
        exclude=None,
        num_nodes=None,
        num_devices=1,
        env={**spec.env, SETTINGS_VAR: settings, **library},
        log_dir=None,
        grace=2.0,
        ssh_check=False,  # the job's pre-flight has just run
        wait_hosts=None,
        console_ranks=None,
        max_restarts=0,
        spare_hosts=0,
        min_nodes=None,
        lost_hosts=[],
        hang_timeout=None,
        start_timeout=START_TIMEOUT_S,
        collective_check=False,
        exclude_from=None,
        # DeepSpeed's runner as the job's; no --sbatch (the check needs a hostfile: never Slurm's)
        backend_options=None if isinstance(spec.backend_options, SlurmOptions) else spec.backend_options,
    )


def run_check(
    spec: JobSpec, hosts: list[str], *, deadline_s: Optional[float] = None, over_job: Optional[str] = None
) -> CollectiveReport:
    """Run the check job on ``hosts`` (one rank each) and judge what the ranks said. ``over_job``: the job
    whose pre-flight has just run; the check starts its ranks and ends over that pre-flight's ssh sessions
    (a fresh ssh per host for mpirun's daemons and the end-of-job sweep cost 4.5 s at 16 hosts here)."""
    if len(hosts) < 2:
        raise UserError(
            "the collective check needs two hosts or more: it measures the links between them",
            where="--collective-check",
        )
    if deadline_s is None:
        deadline_s = START_TIMEOUT_S + STEP_TIMEOUT_S * 4
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gaudi-launch-collective-") as tmp:
        hostfile = os.path.join(tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.write("".join(f"{h} slots=1\n" for h in hosts))
        job = check_spec(spec, hosts, hostfile)
        plan = build_plan(job, backends=get_backend)
        rank_hosts = {r: n.host for n in plan.nodes for r in n.ranks}
        out = io.StringIO()
        # The hard limit: past it, the check job is torn down as on Ctrl-C (its supervisor handles the
        # signal in this, the main thread) and whoever had not answered is named.
        timer = threading.Timer(deadline_s, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        try:
            with sshmux.lent(over_job, plan.job_id) if over_job else contextlib.nullcontext():
                launch(job, plan, stdout=out, stderr=out)
        finally:
            timer.cancel()
    report = judge(
        parse(out.getvalue().splitlines()),
        rank_hosts,
        min_bandwidth=spec.min_bandwidth,
        elapsed_s=time.monotonic() - t0,
    )
    report.backend = plan.backend
    if any(h.status == "failed" and "did not answer" in h.reason for h in report.hosts):
        # a rank that said nothing at all: what its launcher said is the only clue (e.g. mpirun's daemon failed)
        report.job_output = [line for line in out.getvalue().splitlines() if MARKER not in line][-JOB_OUTPUT_LINES:]
    return report


def write_finding(report: CollectiveReport, directory: str) -> Optional[str]:
    """The report as JSON in ``directory`` (the job's --log-dir, else its working directory)."""
    path = os.path.join(directory, RESULT_FILE)
    try:
        with open(path, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    except OSError:
        return None
    return path


def read_exclusions(path: str) -> list[str]:
    """The hosts a written finding names slow or failed (--exclude-from)."""
    try:
        with open(path) as f:
            data = json.load(f)
        bad = list(data.get("slow", [])) + list(data.get("failed", []))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise UserError(
            f"cannot read {path}: {exc}",
            where="--exclude-from",
            hint=f"give the {RESULT_FILE} a collective check wrote",
        ) from None
    if not all(isinstance(h, str) for h in bad):
        raise UserError(f"{path}: 'slow' and 'failed' must list host names", where="--exclude-from")
    return bad


def apply_exclusions(spec: JobSpec) -> JobSpec:
    """--exclude-from: the hosts a written finding named, left out like --exclude."""
    if not spec.exclude_from:
        return spec
    bad = read_exclusions(spec.exclude_from)
    if not bad:
        return spec
    return dataclasses.replace(spec, exclude="@".join(([spec.exclude] if spec.exclude else []) + bad))


def replace_bad_hosts(spec: JobSpec, plan: LaunchPlan, report: CollectiveReport) -> tuple[JobSpec, list[str]]:
    """The spec whose plan leaves the slow and failed hosts out, spares taking their places, and per host
    "HOST (why)"; raises CollectiveCheckFailed when the spares cannot cover the job's hosts. Pure."""
    bad = {h.host: h for h in report.bad}
    if not bad:
        return spec, []
    job_hosts = [n.host for n in plan.nodes]
    good_spares = [h for h in plan.spares if h not in bad]
    bad_job = [h for h in job_hosts if h in bad]
    left_out = [f"{h} ({bad[h].status}: {bad[h].reason})" for h in bad]
    if len(bad_job) > len(good_spares):
        extra = (
            f"\n{len(bad_job)} of the job's hosts must be left out and {len(good_spares)} good spare(s) can "
            "take their places: nothing was started"
        )
        raise CollectiveCheckFailed(report, extra=extra)
    return dataclasses.replace(
        spec, lost_hosts=list(spec.lost_hosts) + [h for h in bad if h not in spec.lost_hosts]
    ), left_out


def check_before_job(spec: JobSpec, plan: LaunchPlan) -> tuple[JobSpec, LaunchPlan]:
    """--collective-check on a launch: measure the job's hosts and spares, write the finding, and give
    the spec and plan to run (slow or failed hosts replaced by spares), or raise (exit 3)."""
    if plan.backend == "slurm":
        raise UserError(
            "--collective-check runs from a hostfile over ssh; under Slurm the allocation decides the nodes",
            where="--collective-check",
            hint="run `gaudi-launch check --collective --hostfile H` on the nodes first, or leave it out",
        )
    hosts = check_hosts_of(plan)
    report = run_check(spec, hosts, over_job=plan.job_id)
    if spec.log_dir:
        prepare_log_dir(spec.log_dir)  # made (0700) or refused here, as the launch would
    written = write_finding(report, spec.log_dir or os.getcwd())
    print(report.render_table(), flush=True)
    if not report.bad and not report.ok:  # hosts not measured, none named: nothing to swap
        raise CollectiveCheckFailed(report, written)
    new_spec, left_out = replace_bad_hosts(spec, plan, report)
    if not left_out:
        return spec, plan
    new_plan = plan_job(new_spec)
    # the restart loop's wording ("lost in an earlier attempt") gives way to the check's reasons
    kept = ["; ".join(p for p in n.split("; ") if not p.startswith("left out (lost")) for n in new_plan.notes]
    notes = [LEFT_OUT + text for text in left_out]
    new_plan.notes = [n for n in kept if n] + notes
    new_plan.left_out = left_out  # the end-of-job summaries repeat them (process/failures.py)
    for n in notes:
        print(f"gaudi-launch: {n}", flush=True)
    return new_spec, new_plan
