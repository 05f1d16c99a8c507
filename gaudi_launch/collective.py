"""Prove the fabric before the job (issues 25 and 33): `check --collective` and `--collective-check`.

The check is a job of its own: one agent per host (the job's hosts and its spares), started by the job's
backend (local, mpirun, deepspeed, srun) with the job's interface, interpreter and environment, running
gaudi_launch.runtime.link_check. The agents pair the hosts in rounds (pairrounds.py), each pair with
a deadline of its own, first over TCP and then, on Gaudi or a GPU, with the library's all-reduce on every
card the job uses, each pair's processes killed by their hosts' agents at its deadline; then the hosts left
run one short all-reduce together. This process only reads the agents' marker lines (it never imports
torch) and judges them (reports/collective.py). The whole check job has a deadline here besides (the sum
of its rounds' deadlines and the start), after which it is torn down like an interrupted job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import secrets
import signal
import tempfile
import threading
import time
from typing import Optional

from gaudi_launch import pairrounds
from gaudi_launch.backends import get_backend
from gaudi_launch.backends.job import launch, plan_job
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs import slurm as slurm_inputs
from gaudi_launch.inputs.backend_options import SlurmOptions, capabilities
from gaudi_launch.inputs.readfile import MAX_INPUT_BYTES, read_bounded
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.pairrounds import MARGIN_S
from gaudi_launch.plan import contract
from gaudi_launch.plan import slurm as slurm_plan
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.process.failures import LEFT_OUT
from gaudi_launch.process.logfiles import prepare_log_dir
from gaudi_launch.remote import sshmux
from gaudi_launch.reports.collective import MARKER, CollectiveReport, judge, parse
from gaudi_launch.safewrite import write_whole
from gaudi_launch.wire import (
    COLLECTIVE,
    COLLECTIVE_LIBRARY,
    COLLECTIVE_SIZE,
    COLLECTIVE_STEP_TIMEOUT,
    COLLECTIVE_TOKEN,
)

RANK_MODULE = "gaudi_launch.runtime.link_check"  # the agent; it starts runtime/collective_check per pair
SETTINGS_VAR = COLLECTIVE  # runtime/link_check.settings
TCP_BYTES = 4 << 20  # the torch-free stage: a few MB, past the latency-bound regime, well under a second
TCP_LOOPS = 5  # after a warm-up; the best is kept (a slow link is slow every time, a busy CPU only in some)
# The library stage's all-reduce per pair, as Habana's health screen runs hccl_demo on each pair of nodes
# (HabanaAI/Setup_and_Install r1.22.0, utils/intel_gaudi_health_screen/template/bare-metal/run_hccl_demo.sh:
# --test all_reduce --size 32m --loop 1000); GAUDI_LAUNCH_COLLECTIVE_SIZE="BYTES,LOOPS" for another.
LIBRARY_BYTES = 32 << 20
LIBRARY_LOOPS = 1000
CONFIRM_LOOPS = 20  # the whole-cluster confirm is short: the pairs measured
# Per TCP pair (the variable is for a fabric known to be slow, and for the tests); a library pair has the
# health screen's level-2 limit (config.yaml: level-2 timeout_s 130) unless the variable is set.
STEP_TIMEOUT_S = float(os.environ.get(COLLECTIVE_STEP_TIMEOUT, "10"))
LIBRARY_TIMEOUT_S = float(os.environ.get(COLLECTIVE_STEP_TIMEOUT, "130"))
START_TIMEOUT_S = 60.0  # every agent started (the job's start limit)
# The rendezvous waits this long for every agent (torch-free, they start within seconds of each other);
# one that has not come by then is named, the others are told to stop.
JOIN_TIMEOUT_S = 2 * STEP_TIMEOUT_S + 10
RESULT_FILE = "collective-check.json"
JOB_OUTPUT_LINES = 20  # of the check job's own output, shown when a host said nothing


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
    if capabilities(plan.backend).scheduler:
        return slurm_nodes(plan.job)
    hosts = [n.host for n in plan.nodes]
    return hosts + [h for h in plan.spares if h not in hosts]


def slurm_nodes(spec: JobSpec) -> list[str]:
    """Under Slurm, every node of the allocation that --include/--exclude select, --num_nodes aside: the
    nodes past --num_nodes are the job's spares (Slurm's count of them), fit to take a slow node's place."""
    selected, _, inside = slurm_plan.select_nodes(
        dataclasses.replace(spec, num_nodes=None, num_devices=1), os.environ, slurm_inputs.scontrol_hostnames
    )
    if not inside:
        raise UserError(
            "under Slurm the collective check measures an allocation's nodes; from a login node srun has "
            "not picked them yet",
            where="--collective-check",
            hint="run gaudi-launch inside salloc or sbatch (srun's nodes are then known), or leave it out",
        )
    return [h for h, _ in selected]


def slurm_check_port(spec: JobSpec) -> int:
    """The check's rendezvous port under Slurm: the job's (from the job id) moved half the span on, so that
    the job after it never meets the check's sockets on its own port. Pure."""
    job_port = spec.master_port or slurm_inputs.port_for_job(os.environ.get("SLURM_JOB_ID", ""))
    base, span = slurm_inputs.PORT_BASE, slurm_inputs.PORT_SPAN
    return base + (job_port - base + span // 2) % span


def library_size(environ=os.environ) -> tuple[int, int]:
    """(bytes, loops) of each pair's all-reduce: GAUDI_LAUNCH_COLLECTIVE_SIZE="32m,1000" (k, m, g: KiB, MiB,
    GiB), else the health screen's. Pure."""
    raw = environ.get(COLLECTIVE_SIZE, "").strip()
    if not raw:
        return LIBRARY_BYTES, LIBRARY_LOOPS
    m = re.fullmatch(r"(\d{1,12})([kmg]?)\s*,\s*(\d{1,9})", raw.lower())
    if not m or int(m.group(1)) == 0 or int(m.group(3)) == 0:
        raise UserError(
            f"{COLLECTIVE_SIZE}={raw!r} is not BYTES,LOOPS",
            where=COLLECTIVE_SIZE,
            hint=f"give e.g. {COLLECTIVE_SIZE}=32m,1000 (hccl_demo's --size 32m --loop 1000), or unset it",
        )
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)]
    return int(m.group(1)) * scale, int(m.group(3))


def check_deadline(n: int) -> float:
    """The whole check job's limit: its start, then every round the stages may run at their deadlines
    (and the confirm), each with the coordinator's margin. A backstop: the pairs' deadlines end a hang. Pure."""
    rounds = pairrounds.max_rounds(n)
    tcp = rounds * (STEP_TIMEOUT_S + MARGIN_S)
    library = (rounds + 1) * (LIBRARY_TIMEOUT_S + JOIN_TIMEOUT_S + MARGIN_S)
    return START_TIMEOUT_S + tcp + library


def job_cards(plan: Optional[LaunchPlan], hosts: list[str]) -> tuple[int, dict[str, dict]]:
    """What the job will use on each check host: (the usual count of its processes on a host, {check rank
    (str): {"cards": its count, "env": the card visibility its ranks get}} for the hosts that differ), e.g.
    --include h:4,5 -> HABANA_VISIBLE_MODULES=4,5. A spare would take a whole node's place: the usual count
    and no restriction. Pure."""
    if plan is None:
        return 1, {}
    nodes = {n.host: n for n in plan.nodes}
    counts = [len(n.ranks) for n in plan.nodes] or [1]
    usual = max(set(counts), key=counts.count)
    inherited = {**os.environ, **plan.env}
    out: dict[str, dict] = {}
    for r, h in enumerate(hosts):
        node = nodes.get(h)
        if node is None:
            continue
        visible = {k: v for k, v in contract.node_visibility_env(node, inherited).items() if v}
        cards = max(1, len(node.ranks))
        if cards != usual or visible:
            out[str(r)] = {"cards": cards, "env": visible}
    return usual, out


def inherited_env(plan: Optional[LaunchPlan]) -> dict[str, str]:
    """The job's own variables the planner decided (the fabric's, HCCL's, the interface's), so that the
    check measures the path the job will take; not the rank contract nor our own. Pure."""
    if plan is None:
        return {}
    skip = set(contract.VISIBILITY) | {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}
    return {k: v for k, v in plan.env.items() if k not in skip and not k.startswith("GAUDI_LAUNCH_")}


def check_spec(
    spec: JobSpec, hosts: list[str], hostfile: Optional[str], job_plan: Optional[LaunchPlan] = None
) -> JobSpec:
    """The check job: the user's job with its program, one agent per host, no restarts and no log dir; the
    job plan's variables (``job_plan``: the job's, after its pre-flight); its settings and a fresh random
    token as job variables (never on a command line). Each pair's library job starts one process per card
    the job uses on each host, with the job's card visibility there. Pure but for the token and Slurm's
    job id. ``hostfile`` None: a Slurm allocation's nodes, one srun task on each of ``hosts``."""
    lib_bytes, lib_loops = library_size()
    cards, nodes = job_cards(job_plan, hosts)
    settings = {
        "bytes": TCP_BYTES,
        "loops": TCP_LOOPS,
        "lib_bytes": lib_bytes,
        "lib_loops": lib_loops,
        "confirm_loops": min(CONFIRM_LOOPS, lib_loops),
        "cards": cards,
        "nodes": nodes,
        "pair_timeout": STEP_TIMEOUT_S,
        "lib_timeout": LIBRARY_TIMEOUT_S,
        "join_timeout": JOIN_TIMEOUT_S,
    }
    library = {COLLECTIVE_LIBRARY: "1"} if os.environ.get(COLLECTIVE_LIBRARY) == "1" else {}  # gloo on a CPU too
    # DeepSpeed's runner as the job's; Slurm's options only for srun's step (one task per node named), no --sbatch
    options = spec.backend_options
    if hostfile is None:
        options = dataclasses.replace(spec.options(SlurmOptions), sbatch=None)
    elif isinstance(options, SlurmOptions):
        options = None
    job = dataclasses.replace(
        spec,
        include="@".join(hosts) if hostfile is None else None,
        master_port=slurm_check_port(spec) if hostfile is None else spec.master_port,
        backend_options=options,
    )
    env = {**inherited_env(job_plan), **spec.env}
    env.update({SETTINGS_VAR: json.dumps(settings), COLLECTIVE_TOKEN: secrets.token_hex(32), **library})
    return dataclasses.replace(
        job,
        program=[RANK_MODULE],
        module=True,
        no_python=False,
        append_local_rank=False,
        hostfile=hostfile,
        exclude=None,
        num_nodes=None,
        num_devices=1,
        env=env,
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
    )


def run_check(
    spec: JobSpec,
    hosts: list[str],
    *,
    deadline_s: Optional[float] = None,
    over_job: Optional[str] = None,
    job_plan: Optional[LaunchPlan] = None,
) -> CollectiveReport:
    """Run the check job on ``hosts`` (one rank each) and judge what the ranks said. ``over_job``: the job
    whose pre-flight has just run; the check starts its ranks and ends over that pre-flight's ssh sessions
    (a fresh ssh per host for mpirun's daemons and the end-of-job sweep cost 4.5 s at 16 hosts here)."""
    if len(hosts) < 2:
        raise UserError(
            "the collective check needs two hosts or more: it measures the links between them",
            where="--collective-check",
            hint="give a --hostfile of two hosts or more, or run inside a Slurm allocation of two nodes or more",
        )
    if deadline_s is None:
        deadline_s = check_deadline(len(hosts))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gaudi-launch-collective-") as tmp:
        hostfile: Optional[str] = None  # under Slurm the allocation is the hostfile
        if not slurm_plan.wanted(spec, os.environ):
            hostfile = os.path.join(tmp, "hostfile")
            with open(hostfile, "w") as f:
                f.write("".join(f"{h} slots=1\n" for h in hosts))
        job = check_spec(spec, hosts, hostfile, job_plan)
        plan = build_plan(job, backends=get_backend)
        rank_hosts = {r: n.host for n in plan.nodes for r in n.ranks}
        out = io.StringIO()
        # The hard limit: past it, the check job is torn down as on Ctrl-C (its supervisor handles the
        # signal in this, the main thread) and whoever had not answered is named.
        timer = threading.Timer(deadline_s, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        try:
            # (srun's step needs no ssh session)
            with sshmux.lent(over_job, plan.job_id) if over_job and hostfile else contextlib.nullcontext():
                launch(job, plan, stdout=out, stderr=out)
        finally:
            timer.cancel()
    report = judge(
        parse(out.getvalue().splitlines()),
        rank_hosts,
        min_bandwidth=spec.min_bandwidth,
        elapsed_s=time.monotonic() - t0,
        scaleout=(job_plan.scaleout if job_plan is not None else None) or {},
    )
    report.backend = plan.backend
    if any(h.status == "failed" and "did not" in h.reason and not h.partners for h in report.hosts):
        # a rank that said nothing at all: what its launcher said is the only clue (e.g. mpirun's daemon failed)
        report.job_output = [line for line in out.getvalue().splitlines() if MARKER not in line][-JOB_OUTPUT_LINES:]
    return report


def write_finding(report: CollectiveReport, directory: str) -> Optional[str]:
    """The report as JSON in ``directory`` (the job's --log-dir, else its working directory), through a
    new file renamed into place: a link planted at the name is replaced, never followed (issue 36)."""
    path = os.path.join(directory, RESULT_FILE)
    try:
        write_whole(path, json.dumps(report.to_json(), indent=2) + "\n")
    except OSError:
        return None
    return path


def read_exclusions(path: str) -> list[str]:
    """The hosts a written finding names slow or failed (--exclude-from)."""
    try:  # bounded, non-blocking, a regular file; deep nesting is RecursionError, not an internal error
        data = json.loads(read_bounded(path, MAX_INPUT_BYTES))
        bad = list(data.get("slow", [])) + list(data.get("failed", []))
    except (OSError, ValueError, AttributeError, TypeError, RecursionError) as exc:
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
    bad, bad_job, good_spares = _triage(report, plan, list(plan.spares))
    if not bad:
        return spec, []
    if len(bad_job) > len(good_spares):
        extra = (
            f"\n{len(bad_job)} of the job's hosts must be left out and {len(good_spares)} good spare(s) can "
            "take their places: nothing was started"
        )
        raise CollectiveCheckFailed(report, extra=extra)
    return dataclasses.replace(
        spec, lost_hosts=list(spec.lost_hosts) + [h for h in bad if h not in spec.lost_hosts]
    ), _left_out(report)


def _triage(report: CollectiveReport, plan: LaunchPlan, spares: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the slow and failed hosts, those of them the job runs on, the spares fit to take their places). Pure."""
    bad = [h.host for h in report.bad]
    bad_job = [n.host for n in plan.nodes if n.host in bad]
    return bad, bad_job, [h for h in spares if h not in bad]


def _left_out(report: CollectiveReport) -> list[str]:
    """Each slow or failed host as "HOST (why)", the way the plan and the summaries show it. Pure."""
    return [f"{h.host} ({h.status}: {h.reason})" for h in report.bad]


def leave_out_slurm_nodes(
    spec: JobSpec, plan: LaunchPlan, checked: list[str], report: CollectiveReport
) -> tuple[JobSpec, list[str]]:
    """As replace_bad_hosts, for an allocation: the slow and failed nodes join --exclude, so that srun's
    --nodelist leaves them out and the checked nodes past --num_nodes (the spares) take their places;
    raises CollectiveCheckFailed when too few good ones are left. Pure."""
    job_nodes = [n.host for n in plan.nodes]
    bad, bad_job, good_spares = _triage(report, plan, [h for h in checked if h not in job_nodes])
    if not bad:
        return spec, []
    if len(bad_job) > len(good_spares):
        extra = (
            f"\n{len(bad_job)} of the job's nodes must be left out and {len(good_spares)} good spare node(s) can "
            "take their places: nothing was started (under Slurm the spares are the allocation's nodes past "
            f"--num_nodes: --spare-hosts needs a hostfile; allocate more nodes than --num_nodes, or give "
            f"--exclude {'@'.join(bad_job)} to run on fewer)"
        )
        raise CollectiveCheckFailed(report, extra=extra)
    exclude = "@".join(([spec.exclude] if spec.exclude else []) + bad)
    return dataclasses.replace(spec, exclude=exclude), _left_out(report)


def check_before_job(spec: JobSpec, plan: LaunchPlan) -> tuple[JobSpec, LaunchPlan]:
    """--collective-check on a launch: measure the job's hosts and spares, write the finding, and give
    the spec and plan to run (slow or failed hosts replaced by spares), or raise (exit 3)."""
    hosts = check_hosts_of(plan)
    report = run_check(spec, hosts, over_job=plan.job_id, job_plan=plan)
    if spec.log_dir:
        prepare_log_dir(spec.log_dir)  # made (0700) or refused here, as the launch would
    written = write_finding(report, spec.log_dir or os.getcwd())
    print(report.render_table(), flush=True)
    if not report.bad and not report.ok:  # hosts not measured, none named: nothing to swap
        raise CollectiveCheckFailed(report, written)
    if capabilities(plan.backend).scheduler:
        new_spec, left_out = leave_out_slurm_nodes(spec, plan, hosts, report)
    else:
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
