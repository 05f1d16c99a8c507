"""The ``gaudi-launch`` command: parses options, builds the plan, shows or runs it.

Everything after SCRIPT is the script's own argv and is passed on untouched. No torch here.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import typing
from typing import Optional

import click
from click.core import ParameterSource

from gaudi_launch import __version__
from gaudi_launch.completion import completion_options, legacy_bash
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode, for_signal
from gaudi_launch.inputs.options import default_of, option_fields
from gaudi_launch.inputs.spec import JobSpec, resolve_compat

HELP = """Launch SCRIPT on every selected device of every host, one process per device.

Examples:

  gaudi-launch --num_devices 8 train.py --bf16          (this host, 8 ranks)

  gaudi-launch --hostfile hostfiles/two-dl1-nodes train.py --config cfg.json

  gaudi-launch --hostfile H --include 'worker-0:0,1@worker-1' --dry-run train.py

  gaudi-launch check --hostfile H train.py      (pre-flight only; also --check-only)

  gaudi-launch report RUN_DIR                   (plots of a run's metrics.jsonl or a bench JSON)

  gaudi-launch env [--json]                     (versions, devices, network: paste it into bug reports)

  gaudi-launch run plan.json                    (run what --dry-run --json wrote, as it was)

Exit status: 0 on success; the first failing rank's exit code (128+N for signal N);
2 for bad input or options; 3 when the pre-flight failed (nothing started);
4 when a host stopped answering mid-run; 5 when no rank advanced for --hang-timeout seconds;
128+N when the launcher itself got signal N.
"""

CHECK_HELP = """Usage: gaudi-launch check [OPTIONS] [SCRIPT]

  The pre-flight alone: reach every selected host over SSH and check its Python, the script, the
  working directory, its Gaudi devices (hl-smi), the master port and the network interface; print
  the table and exit 0, or 3 when a check failed. Nothing is started. (Same as --check-only.)

Options (as for a launch):
  --hostfile PATH                  the hosts ('HOST slots=N' per line)
  --include SEL, --exclude SEL     which hosts/devices ('host1:0,2@host2')
  --num_nodes N, --num_devices N   how many hosts, how many devices per host
  --master_addr A, --master_port P the rendezvous to check (default: the first host, a free port)
  --python PY                      the interpreter the ranks would use
  --ssh-port P, --ssh-identity KEY, --ssh-config FILE, --ssh-timeout S, --strict-host-keys
  --config job.yaml                any of these as YAML keys
  -h, --help                       this text
"""


def _version(ctx: click.Context, _param, value: bool):
    if value and not ctx.resilient_parsing:
        click.echo(f"gaudi-launch {__version__}")
        ctx.exit()


def _flag(name: str, *flags: str, help: str, **kw) -> click.Option:
    return click.Option([name, *flags], is_flag=True, default=False, help=help, **kw)


def _text(name: str, *flags: str, help: str, kind=str) -> click.Option:
    return click.Option([name, *flags], type=kind, default=None, help=help)


# Command-line-only options: spellings of other launchers, and how this command runs. Each is shown
# after the JobSpec option it goes with; the JobSpec options themselves come from spec.py.
_AFTER = {
    "num_devices": [
        _text("world_size", "--world_size", "--world-size", kind=int, help="gaudi_spawn.py's name for --num_devices."),
        _text(
            "nproc_per_node",
            "--nproc-per-node",
            "--nproc_per_node",
            help="torchrun's name for --num_devices; also auto or gpu (the devices found) and cpu (this "
            "machine's CPUs).",
        ),
        _text("nnodes", "--nnodes", help="torchrun's name for --num_nodes."),
        _flag("standalone", "--standalone", help="torchrun's: accepted (one host needs no rendezvous service)."),
        _text(
            "ranks_filter",
            "--local-ranks-filter",
            "--local_ranks_filter",
            "--ranks",
            help="Show only these ranks on the console, e.g. 0 or 0,3 (every rank still goes to --log-dir "
            "and to the failure summary).",
        ),
    ],
    "backend": [
        _flag("use_mpi", "--use_mpi", "--use-mpi", help="gaudi_spawn.py: same as --backend mpirun."),
        _flag(
            "use_deepspeed", "--use_deepspeed", "--use-deepspeed", help="gaudi_spawn.py: same as --backend deepspeed."
        ),
    ],
    "append_local_rank": [
        _flag(
            "no_local_rank",
            "--no_local_rank",
            "--no-local-rank",
            help="Accepted for DeepSpeed compatibility: this is already the default.",
        ),
    ],
    "strict_host_keys": [
        _flag("no_ssh_check", "--no-ssh-check", "--no_ssh_check", help="Skip the SSH pre-flight of every host."),
    ],
    "wait_hosts": [
        _flag(
            "check_only",
            "--check-only",
            "--check_only",
            help="Run the pre-flight only and print its table (exit 3 when a check fails).",
        ),
    ],
    "slurm_args": [
        _text(
            "device", "--device", help="hpu, cuda or cpu for the ranks' training runtime (default: what the host has)."
        ),
    ],
}
_LAST = [
    _flag("dry_run", "--dry-run", "--dry_run", help="Print the plan; start nothing."),
    _flag("json_out", "--json", help="With --dry-run: print the plan as one JSON object."),
    _text("config", "--config", help="YAML job file holding any of these options; the command line wins."),
    _text(
        "from_plan",
        "--from-plan",
        "--from_plan",
        help="Run the plan a dry run wrote (--dry-run --json > plan.json), in its directory, with all its options; "
        "nothing starts if the job planned now differs from it. Same as: gaudi-launch run plan.json.",
    ),
    _flag(
        "version",
        "--version",
        "-V",
        callback=_version,
        expose_value=False,
        is_eager=True,
        help="Print the version and exit.",
    ),
    *completion_options(),
]
_ARGUMENTS = [
    ("SCRIPT", "Training script (or module with -m)."),
    ("[SCRIPT_ARGS]...", "Passed to the script untouched."),
]
# Names that are no option in a job file (the job file itself, the version, completion).
_NOT_IN_CONFIG = ("config", "version", "show_completion", "install_completion")


def _spec_option(f, option, hint) -> click.Option:
    """A JobSpec field's command-line option, from its metadata and type."""
    default = default_of(f)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if typing.get_origin(hint) is typing.Union else hint
    many = typing.get_origin(kind) in (list, dict)  # repeatable text items (-x KEY=VALUE, --export-prefix P)
    if kind is bool:
        return click.Option([f.name, *option.flags], is_flag=True, default=default, help=option.help)
    return click.Option(
        [f.name, *option.flags],
        type=str if many else kind,
        multiple=many,
        default=default,
        help=option.help,
        show_default=default is not None,
    )


def _params() -> list[click.Parameter]:
    hints = typing.get_type_hints(JobSpec)
    params: list[click.Parameter] = [
        click.Argument(["script"], required=False, metavar="[SCRIPT]"),
        click.Argument(["script_args"], nargs=-1, required=False, metavar="[SCRIPT_ARGS]..."),
    ]
    for f, option in option_fields(JobSpec):
        if option.flags:
            params.append(_spec_option(f, option, hints[f.name]))
        params.extend(_AFTER.get(f.name, []))
    return params + _LAST


class _LaunchCommand(click.Command):
    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Arguments"):
            formatter.write_dl(_ARGUMENTS)
        super().format_options(ctx, formatter)


def _run(**values) -> int:
    ctx = click.get_current_context()
    if values["from_plan"]:
        return _replay(ctx, values)
    from_config = _apply_config(ctx, values, values["config"]) if values["config"] else {}
    try:
        if values["no_local_rank"] and values["append_local_rank"]:
            raise UserError("--no_local_rank and --append-local-rank contradict each other", where="--no_local_rank")
        return _launch(values)
    except UserError as exc:
        raise _at_config_line(ctx, exc, from_config) from None


def _at_config_line(ctx: click.Context, exc: UserError, from_config: dict[str, str]) -> UserError:
    """An error about an option whose value came from the job file names the file's line (and the
    option), not the flag the user never typed."""
    flag = (exc.where or "").split(" ", 1)[0]
    name = next((p.name for p in ctx.command.params if flag in getattr(p, "opts", ())), None)
    if not flag.startswith("-") or name not in from_config:
        return exc
    message = exc.message if exc.message.startswith(flag) else f"{flag}: {exc.message}"
    return UserError(message, where=from_config[name], hint=exc.hint)


def _replay(ctx: click.Context, v: dict) -> int:
    """--from-plan: the plan's options, no others (replay.py)."""
    from gaudi_launch.launch import prepare
    from gaudi_launch.plan.replay import check_before_hosts, enter_cwd, read_plan, spec_from_request

    given = [
        p.opts[0] if isinstance(p, click.Option) else p.name.upper()
        for p in ctx.command.params
        if p.name not in ("from_plan", "dry_run", "json_out")
        and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise UserError(
            f"{given[0]}: a plan brings all its options",
            where="--from-plan",
            hint="give only the plan (and --dry-run, --json), or make the plan again with the change",
        )
    if v["json_out"] and not v["dry_run"]:
        raise UserError("--json only applies to --dry-run", where="--json")
    path = os.path.abspath(v["from_plan"])
    saved = read_plan(path)
    enter_cwd(saved, path)
    spec = spec_from_request(saved["request"], os.environ, path)
    check_before_hosts(saved, prepare(spec), path)
    return run_spec(spec, dry_run=v["dry_run"], json_out=v["json_out"], same_as=(saved, path))


def command() -> click.Command:
    """The launch command (``check``, ``env`` and ``report`` are dispatched before it, in main)."""
    return _LaunchCommand(
        "gaudi-launch",
        params=_params(),
        callback=_run,
        help=HELP,
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    )


def _apply_config(ctx: click.Context, values: dict, path: str) -> dict[str, str]:
    """Set the values the job file gives (the command line wins); {parameter name: "file:line"} of those set."""
    from gaudi_launch.inputs.config import load_config, normalize_key

    params = {p.name: p for p in ctx.command.params}
    # any long flag works as a key too (ranks, no-ssh-check), not only the parameter's own name
    by_flag = {normalize_key(o): p.name for p in ctx.command.params for o in getattr(p, "opts", ()) if o[:2] == "--"}
    taken = {}
    for name, raw, where in load_config(path):
        name = name if name in params else by_flag.get(name, name)
        param = params.get(name)
        if param is None or name in _NOT_IN_CONFIG:
            raise UserError(
                f"unknown option '{name}'",
                where=where,
                hint="keys are the long option names, e.g. hostfile, num_devices, master_port",
            )
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            continue  # the command line wins
        if name == "script_args" and ctx.get_parameter_source("script") not in (ParameterSource.DEFAULT, None):
            continue  # a script given on the command line brings its own arguments
        values[name] = _config_value(ctx, param, name, raw, where)
        taken[name] = where
    return taken


def _config_value(ctx: click.Context, param: click.Parameter, name: str, raw, where: str):
    """A YAML value checked as strictly as the same option on the command line."""
    # messages name the option's flag, never the parameter's internal name (json_out is --json)
    label = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), name)
    if name == "env" and isinstance(raw, dict):
        raw = [f"{k}={'' if v is None else v}" for k, v in raw.items()]
    many = param.multiple or param.nargs == -1
    if many and not isinstance(raw, list):
        raise UserError(f"{label} is a list", where=where, hint=f"{name}: [a, b]")
    if not many and isinstance(raw, (list, dict)):
        raise UserError(f"{label} takes a single value, not a {type(raw).__name__}", where=where)
    items = raw if many else [raw]
    if any(v is None for v in items):  # YAML null: click would pass None on and fail much later
        raise UserError(f"{label} has no value", where=where, hint=f"give {label} a value, or leave the key out")
    if isinstance(param.type, click.types.BoolParamType) and not all(isinstance(v, bool) for v in items):
        raise UserError(f"{label} is true or false, got {raw!r}", where=where)
    if isinstance(param.type, click.types.IntParamType) and any(isinstance(v, (bool, float)) for v in items):
        raise UserError(f"{label} must be a whole number", where=where)
    if name == "env":
        _check_env_items(items, where)
    if isinstance(param.type, click.types.StringParamType):
        if any(isinstance(v, (list, dict)) for v in items):
            raise UserError(f"{label} takes text, not a nested list or mapping", where=where)
        items = [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in items]
        raw = items if many else items[0]
    try:
        return param.type_cast_value(ctx, raw)
    except (click.BadParameter, TypeError, ValueError) as exc:
        raise UserError(f"bad value for {label}: {getattr(exc, 'message', exc)}", where=where)


def _check_env_items(items: list, where: str) -> None:
    """A job file's env items, checked here so that errors name the job file's line."""
    from gaudi_launch.inputs.envfile import parse_assignments

    hint = 'env: {NAME: "value"} or env: ["NAME=value"]'
    if not all(isinstance(v, str) for v in items):
        raise UserError("env items are NAME=VALUE text", where=where, hint=hint)
    try:
        parse_assignments(items, "env", environ=os.environ)
    except UserError as exc:
        raise UserError(exc.message, where=where, hint=hint) from None


def _launch(v: dict) -> int:
    from gaudi_launch.inputs.envfile import parse_assignments

    if not v["script"] and not v["check_only"]:
        raise UserError(
            "no training script given",
            where="SCRIPT",
            hint="gaudi-launch [OPTIONS] train.py [SCRIPT_ARGS]...  (see --help)",
        )
    from gaudi_launch.inputs import habits

    num_devices, num_nodes = v["num_devices"], v["num_nodes"]
    if v["nproc_per_node"] is not None:
        if num_devices is not None:
            raise UserError("--nproc-per-node and --num_devices say the same thing: give one", where="--nproc-per-node")
        num_devices = habits.nproc_per_node(v["nproc_per_node"])
    if v["nnodes"] is not None:
        if num_nodes is not None:
            raise UserError("--nnodes and --num_nodes say the same thing: give one", where="--nnodes")
        num_nodes = habits.nnodes(v["nnodes"])
    backend, num_devices = resolve_compat(
        backend=v["backend"],
        use_mpi=v["use_mpi"],
        use_deepspeed=v["use_deepspeed"],
        world_size=v["world_size"],
        num_devices=num_devices,
    )
    if v["json_out"] and not v["dry_run"] and not (v["check_only"] and v["collective_check"]):
        raise UserError("--json only applies to --dry-run (and to check --collective)", where="--json")
    program = [v["script"], *(v["script_args"] or [])] if v["script"] else []
    if (
        program
        and not v["dry_run"]
        and not v["hostfile"]
        and backend in ("auto", "local")
        and not os.environ.get("SLURM_JOB_ID")
    ):
        # this machine runs the ranks: a script that is not here fails now, not once per rank
        habits.check_program(program, module=v["module"], no_python=v["no_python"], cwd=os.getcwd())
    if program and not v["dry_run"]:
        for note in habits.notes(
            program,
            module=v["module"],
            no_python=v["no_python"],
            cwd=os.getcwd(),
            append_local_rank=v["append_local_rank"],
            launcher_options=_option_names(),
        ):
            print(f"gaudi-launch: note: {note}", file=sys.stderr)
    # Every JobSpec option from its own flag; the rest from the command-line-only spellings above.
    given = {f.name: v[f.name] for f, option in option_fields(JobSpec) if option.flags}
    if not given["python"]:
        del given["python"]  # this interpreter
    given.update(
        program=program,
        num_nodes=num_nodes,
        num_devices=num_devices,
        backend=backend,
        env={**parse_assignments(v["env"] or [], "-x", environ=os.environ), **_device_env(v["device"])},
        export_prefixes=list(v["export_prefixes"] or []),
        ssh_check=not v["no_ssh_check"],
        console_ranks=_ranks(v["ranks_filter"]),
    )
    spec = JobSpec(**given)
    if v["check_only"] and v["no_ssh_check"]:
        raise UserError("--check-only and --no-ssh-check contradict each other", where="--check-only")
    return run_spec(spec, dry_run=v["dry_run"], json_out=v["json_out"], check_only=v["check_only"])


def _ranks(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise UserError(f"--ranks {text!r}: rank numbers separated by commas, e.g. 0 or 0,3", where="--ranks")
    return sorted({int(p) for p in parts})


def _device_env(device: Optional[str]) -> dict:
    if device is None:
        return {}
    if device not in ("hpu", "cuda", "cpu"):
        raise UserError(f"unknown device {device!r}", where="--device", hint="hpu, cuda or cpu")
    return {"GAUDI_LAUNCH_DEVICE": device}


def run_spec(
    spec, *, dry_run: bool = False, json_out: bool = False, check_only: bool = False, same_as: Optional[tuple] = None
) -> int:
    """Show, check or run the job of ``spec``; ``same_as`` (saved plan, its path): only if the plan
    made now is that one (a replay)."""
    from gaudi_launch.launch import launch, plan_job, preflight_for, prepare
    from gaudi_launch.plan.planner import build_plan
    from gaudi_launch.plan.replay import check_same, plan_json

    spec = prepare(spec)
    if check_only:
        plan = build_plan(spec, require_program=False)
        if plan.backend == "slurm":  # no hostfile, no ssh: the nodes are probed through srun
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
        return _collective_only(spec, plan, json_out)
    if spec.exclude_from:  # the hosts a collective check named, left out like --exclude
        from gaudi_launch.collective import apply_exclusions

        spec = apply_exclusions(spec)
    plan = plan_job(spec, keep_failed_preflight=dry_run)
    if spec.collective_check and not dry_run and not spec.sbatch:
        from gaudi_launch.collective import check_before_job

        spec, plan = check_before_job(spec, plan)
    if same_as is not None:
        check_same(same_as[0], plan_json(plan, os.environ), same_as[1])
    if dry_run:  # the plan whatever the pre-flight said, its findings with it; exit 3 if it failed
        # as JSON with its secrets' keyed digests, so that `gaudi-launch run` can check their values
        shown = json.dumps(plan_json(plan, os.environ), indent=2) + "\n" if json_out else plan.render_text()
        sys.stdout.write(shown)
        if plan.preflight is not None and not plan.preflight["ok"]:
            print(
                "gaudi-launch: pre-flight failed: a real run would start nothing (findings in the plan)",
                file=sys.stderr,
            )
            return ExitCode.PREFLIGHT
        return 0
    if spec.sbatch:  # a batch script for the job, nothing started
        from gaudi_launch.plan.sbatch import write

        if plan.backend != "slurm":
            raise UserError("--sbatch writes a Slurm batch script", where="--sbatch", hint="add --backend slurm")

        written = write(plan, spec, os.environ)
        print(
            f"gaudi-launch: wrote {written['script']} and {written['env_file']}; submit with: sbatch "
            f"{written['script']}",
            file=sys.stderr,
        )
        return 0
    return launch(spec, plan, announce=True).exit_code


def _collective_only(spec, plan, json_out: bool) -> int:
    """`check --collective`: the collective test on the checked hosts, its table (or JSON), exit 3 naming
    the slow or failed hosts."""
    from gaudi_launch.collective import check_hosts_of, run_check

    report = run_check(spec, check_hosts_of(plan))
    if json_out:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(report.render_table() + "\n")
    verdict = report.verdict()
    if verdict:
        print(f"gaudi-launch: error: {verdict}", file=sys.stderr)
    return ExitCode.OK if report.ok else ExitCode.PREFLIGHT


def _option_names() -> list[str]:
    """Every long option of the launch command (for the 'option after the script' note)."""
    return [name for p in command().params for name in getattr(p, "opts", []) if name.startswith("--")]


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:  # `gaudi-launch check [OPTIONS] [SCRIPT]` = --check-only
        if any(a in ("-h", "--help") for a in argv[1:]):
            print(CHECK_HELP, end="")
            return 0
        argv = ["--check-only", *argv[1:]]
    if argv[:1] == ["run"]:  # `gaudi-launch run [--dry-run [--json]] PLAN.json` = --from-plan PLAN.json
        plans = [a for a in argv[1:] if not a.startswith("-")]
        argv = [a for a in argv[1:] if a.startswith("-")] + (["--from-plan", plans[0]] if len(plans) == 1 else [])
        if len(plans) != 1 and not any(a in ("-h", "--help") for a in argv):
            print(
                "gaudi-launch: error: run takes one plan: gaudi-launch run [--dry-run [--json]] plan.json\n"
                "  hint: make one with: gaudi-launch --dry-run --json [OPTIONS] SCRIPT > plan.json",
                file=sys.stderr,
            )
            return ExitCode.USAGE
    if argv[:1] == ["env"]:  # `gaudi-launch env [--json]`: versions and devices, for bug reports
        from gaudi_launch.reports.environment import main as env_main

        return env_main(argv[1:])
    if argv[:1] == ["report"]:  # `gaudi-launch report RUN_DIR [--out DIR]`: plots (matplotlib, imported there)
        from gaudi_launch.reports.plots import main as report_main

        return report_main(argv[1:])
    launch = command()
    words = legacy_bash(launch)
    if words is not None:
        print(words)
        return 0
    try:
        return launch.main(args=argv, prog_name="gaudi-launch", standalone_mode=False) or 0
    except UserError as exc:
        print(f"gaudi-launch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.NoSuchOption as exc:
        from gaudi_launch.inputs.habits import torchrun_option_error

        known = torchrun_option_error(exc.option_name)
        if known is None:
            exc.show()
            return exc.exit_code
        print(f"gaudi-launch: error: {known}", file=sys.stderr)
        return known.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("gaudi-launch: interrupted", file=sys.stderr)
        return for_signal(signal.SIGINT)
    except Exception as exc:  # a bug of ours: say so briefly; the traceback on request
        if os.environ.get("GAUDI_LAUNCH_DEBUG"):
            raise
        print(
            f"gaudi-launch: internal error: {type(exc).__name__}: {exc}\n"
            "  hint: rerun with GAUDI_LAUNCH_DEBUG=1 for the traceback and please report it",
            file=sys.stderr,
        )
        return ExitCode.INTERNAL
