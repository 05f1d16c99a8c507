"""The one composition root of the command line: from the values cli.py parsed to a finished job.

``run_command`` merges the job file (--config) under the command line, checks every value against its
field's type (inputs/commandline.py) and builds the JobSpec; ``run_spec`` then shows, checks or runs it:
check-only (the pre-flight, and ``check --collective``), the dry run (text or JSON), --sbatch (a batch
script, nothing started) or the launch itself (backends/job.py). ``replay`` (``gaudi-launch run
plan.json``) takes the same path with the plan's own options (``gaudi-launch env`` and ``report`` are
reports/, which typercli.py calls). What only a job that starts needs is imported when one starts, never by
a dry run: the ssh pre-flight (backends/job.py), the supervisor (backends/local.py), the collective test
(``collective()``): issue 37, the dry run's start-up budget.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any, Optional

from gaudi_launch.backends import get_backend
from gaudi_launch.backends.job import launch, plan_job, preflight_for, prepare
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs import habits
from gaudi_launch.inputs.backend_options import AUTO, SlurmOptions, capabilities
from gaudi_launch.inputs.commandline import EXTRA_OPTIONS, NOT_IN_CONFIG, convert, launch_options, spec_from_values
from gaudi_launch.inputs.config import load_config, normalize_key
from gaudi_launch.inputs.envfile import parse_assignments
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import sbatch
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.plan.replay import (
    check_before_hosts,
    check_format,
    check_same,
    enter_cwd,
    fill_request,
    plan_json,
    read_plan,
    spec_from_request,
)

__all__ = ["replay", "run_command", "run_spec"]
# Not options of the launch command, but keys of a job file (and values run_command takes).
_PROGRAM = {"script": Optional[str], "script_args": Optional[list[str]]}
# With --from-plan these may be given; the plan brings every other option.
_WITH_A_PLAN = ("from_plan", "dry_run", "json_out")


def run_command(given: dict[str, Any]) -> int:
    """The launch command. ``given``: what the command line gave, by option name (the text as typed,
    True for a flag, a list for a repeatable option; an option not given is absent), and ``script``,
    ``script_args``."""
    options = {o.name: o for o in launch_options()}
    values = {
        name: convert(options[name].hint, raw, options[name].label) if name in options else raw
        for name, raw in given.items()
    }
    if values.get("from_plan"):
        others = [n for n in values if n not in _WITH_A_PLAN]
        if others:
            raise UserError(
                f"{options[others[0]].label if others[0] in options else others[0].upper()}: a plan brings all its "
                "options",
                where="--from-plan",
                hint="give only the plan (and --dry-run, --json), or make the plan again with the change",
            )
        return replay(values["from_plan"], dry_run=bool(values.get("dry_run")), json_out=bool(values.get("json_out")))
    from_config = merge_config(values, values["config"]) if values.get("config") else {}
    full = {**{o.name: o.default for o in options.values()}, "script": None, "script_args": None, **values}
    try:
        return _run_values(full)
    except UserError as exc:
        raise _at_config_line(exc, from_config) from None


def merge_config(values: dict[str, Any], path: str) -> dict[str, str]:
    """Add the values the job file gives to ``values`` (the command line wins), each checked against its
    field's type; {option name: "file:line"} of those added."""
    options = {o.name: o for o in launch_options()}
    # any long flag works as a key too (ranks, no-ssh-check), not only the option's own name
    by_flag = {
        normalize_key(flag): o.name
        for o in options.values()
        for spelling in o.option.flags
        for flag in spelling.split("/")
        if flag.startswith("--")
    }
    taken, typed = {}, set(values)
    for key, raw, where in load_config(path):
        name = key if key in options or key in _PROGRAM else by_flag.get(key, key)
        if name in NOT_IN_CONFIG or (name not in options and name not in _PROGRAM):
            raise UserError(
                f"unknown option '{key}'",
                where=where,
                hint="keys are the long option names, e.g. hostfile, num_devices, master_port",
            )
        if name in typed or (name == "script_args" and "script" in typed):
            continue  # the command line wins; a script given there brings its own arguments
        hint, label = (options[name].hint, options[name].label) if name in options else (_PROGRAM[name], name)
        try:
            values[name] = convert(hint, raw, label)
            if name == "env":
                parse_assignments(values[name], "env", environ=os.environ)
        except UserError as exc:  # named by the job file's line, and the option
            hint_text = 'env: {NAME: "value"} or env: ["NAME=value"]' if name == "env" else exc.hint
            message = exc.message if exc.message.startswith(label) else f"{label} {exc.message}"
            raise UserError(message, where=where, hint=hint_text) from None
        taken[name] = where
    return taken


def _at_config_line(exc: UserError, from_config: dict[str, str]) -> UserError:
    """An error about an option whose value came from the job file names the file's line (and the
    option), not the flag the user never typed."""
    flag = (exc.where or "").split(" ", 1)[0]
    name = next(
        (o.name for o in launch_options() if flag in [f for s in o.option.flags for f in s.split("/")]),
        None,
    )
    if not flag.startswith("-") or name not in from_config:
        return exc
    message = exc.message if exc.message.startswith(flag) else f"{flag}: {exc.message}"
    return UserError(message, where=from_config[name], hint=exc.hint)


def _run_values(v: dict[str, Any]) -> int:
    if v["no_local_rank"] and v["append_local_rank"]:
        raise UserError("--no_local_rank and --append-local-rank contradict each other", where="--no_local_rank")
    if not v["script"] and not v["check_only"]:
        raise UserError(
            "no training script given",
            where="SCRIPT",
            hint="gaudi-launch [OPTIONS] train.py [SCRIPT_ARGS]...  (see --help)",
        )
    spec = spec_from_values(v, os.environ)
    if v["json_out"] and not v["dry_run"] and not (v["check_only"] and v["collective_check"]):
        raise UserError("--json only applies to --dry-run (and to check --collective)", where="--json")
    program, cwd = spec.program, os.getcwd()
    if program and not v["dry_run"]:
        one_host = spec.backend == AUTO or not capabilities(spec.backend).multi_host
        local = not spec.hostfile and one_host and not os.environ.get("SLURM_JOB_ID")
        if local:  # this machine runs the ranks: a script that is not here fails now, not once per rank
            habits.check_program(program, module=spec.module, no_python=spec.no_python, cwd=cwd)
        for note in habits.notes(
            program,
            module=spec.module,
            no_python=spec.no_python,
            cwd=cwd,
            append_local_rank=spec.append_local_rank,
            launcher_options=option_names(),
        ):
            print(f"gaudi-launch: note: {note}", file=sys.stderr)
    if v["check_only"] and v["no_ssh_check"]:
        raise UserError("--check-only and --no-ssh-check contradict each other", where="--check-only")
    return run_spec(spec, dry_run=v["dry_run"], json_out=v["json_out"], check_only=v["check_only"])


def option_names() -> list[str]:
    """Every long option of the launch command (for the 'option after the script' note). Pure."""
    spellings = [s for o in launch_options() for s in o.option.flags] + [s for o in EXTRA_OPTIONS for s in o.flags]
    return [flag for s in spellings for flag in s.split("/") if flag.startswith("--")]


def replay(path: str, *, dry_run: bool = False, json_out: bool = False) -> int:
    """``gaudi-launch run plan.json`` (--from-plan): the plan's options, no others (replay.py)."""
    if json_out and not dry_run:
        raise UserError("--json only applies to --dry-run", where="--json")
    path = os.path.abspath(path)
    saved = read_plan(path)
    check_format(saved, path)
    saved["request"], predated = fill_request(saved["request"])
    enter_cwd(saved, path)
    spec = spec_from_request(saved["request"], os.environ, path)
    if predated:  # said once the request is known to be a plan's
        print(
            f"gaudi-launch: note: the plan predates the options {', '.join(predated)}: taken at their defaults",
            file=sys.stderr,
        )
    check_before_hosts(saved, prepare(spec), path, get_backend)
    return run_spec(spec, dry_run=dry_run, json_out=json_out, same_as=(saved, path))


def run_spec(
    spec: JobSpec,
    *,
    dry_run: bool = False,
    json_out: bool = False,
    check_only: bool = False,
    same_as: Optional[tuple] = None,
) -> int:
    """Show, check or run the job of ``spec``; ``same_as`` (saved plan, its path): only if the plan
    made now is that one (a replay)."""
    spec = prepare(spec)
    if check_only:
        plan = build_plan(spec, require_program=False, backends=get_backend)
        scheduled = capabilities(plan.backend).scheduler
        if scheduled and spec.collective_check:  # srun probed the nodes: the check itself is next
            return collective_only(spec, plan, json_out)
        if scheduled:  # no hostfile, no ssh: the nodes are probed through srun
            raise UserError(
                "the pre-flight checks a hostfile's hosts over ssh; a Slurm job has neither",
                where="--check-only",
                hint="inside the allocation, --dry-run shows what srun found on the nodes (interface, addresses)",
            )
        report = preflight_for(spec)(plan, spec)
        table = report.render_table()
        if not (spec.collective_check and json_out):
            sys.stdout.write(table if table.endswith("\n") else table + "\n")
        if not report.ok or not spec.collective_check:
            return ExitCode.OK if report.ok else ExitCode.PREFLIGHT
        return collective_only(spec, plan, json_out)
    if spec.exclude_from:  # the hosts a collective check named, left out like --exclude
        spec = collective().apply_exclusions(spec)
    plan = plan_job(spec, keep_failed_preflight=dry_run)
    if spec.collective_check and not dry_run and not spec.options(SlurmOptions).sbatch:
        spec, plan = collective().check_before_job(spec, plan)
    if same_as is not None:
        check_same(same_as[0], plan_json(plan, os.environ), same_as[1])
    if dry_run:  # the plan whatever the pre-flight said, its findings with it; exit 3 if it failed
        # as JSON with its secrets' keyed digests, so that `gaudi-launch run` can check their values
        shown = json.dumps(plan_json(plan, os.environ), indent=2) + "\n" if json_out else plan.render_text()
        sys.stdout.write(shown)
        sys.stdout.flush()  # the plan first, also when both streams go to one pipe (2>&1 | tee)
        if plan.preflight is not None and not plan.preflight["ok"]:
            if json_out:  # the text plan ends with the verdict itself; JSON has none to read at a glance
                print(
                    "gaudi-launch: pre-flight failed: a real run would start nothing (findings in the plan)",
                    file=sys.stderr,
                )
            return ExitCode.PREFLIGHT
        return 0
    if spec.options(SlurmOptions).sbatch:  # a batch script for the job, nothing started
        if not capabilities(plan.backend).batch_script:
            raise UserError("--sbatch writes a Slurm batch script", where="--sbatch", hint="add --backend slurm")
        written = sbatch.write(plan, spec, os.environ)
        print(
            f"gaudi-launch: wrote {written['script']} and {written['env_file']}; submit with: sbatch "
            f"{written['script']}",
            file=sys.stderr,
        )
        return 0
    return launch(spec, plan, announce=True).exit_code


def collective() -> ModuleType:
    """collective.py, imported by a job that asks for the collective test (or leaves out the hosts one
    named): its pair rounds and statistics are not a dry run's to load (issue 37, the start-up budget)."""
    from gaudi_launch import collective as module

    return module


def collective_only(spec: JobSpec, plan, json_out: bool) -> int:
    """`check --collective`: the collective test on the checked hosts, its table (or JSON), exit 3 naming
    the slow or failed hosts."""
    test = collective()
    report = test.run_check(spec, test.check_hosts_of(plan), over_job=plan.job_id, job_plan=plan)
    if json_out:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(report.render_table() + "\n")
    verdict = report.verdict()
    if verdict:
        print(f"gaudi-launch: error: {verdict}", file=sys.stderr)
    return ExitCode.OK if report.ok else ExitCode.PREFLIGHT
