"""The ``gaudi-launch`` command: parses options, builds the plan, shows or runs it.

Everything after SCRIPT is the script's own argv and is passed on untouched. No torch here.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional

import click
import typer
from click.core import ParameterSource

from gaudi_launch import __version__
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode, for_signal


HELP = """Launch SCRIPT on every selected device of every host, one process per device.

Examples:

  gaudi-launch --num_devices 8 train.py --bf16          (this host, 8 ranks)

  gaudi-launch --hostfile hostfiles/two-dl1-nodes train.py --config cfg.json

  gaudi-launch --hostfile H --include 'worker-0:0,1@worker-1' --dry-run train.py

  gaudi-launch check --hostfile H train.py      (pre-flight only; also --check-only)

  gaudi-launch report RUN_DIR                   (plots of a run's metrics.jsonl or a bench JSON)

  gaudi-launch env [--json]                     (versions, devices, network: paste it into bug reports)

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

_app = typer.Typer(add_completion=True, rich_markup_mode=None, pretty_exceptions_enable=False)


def _version(value: bool):
    if value:
        typer.echo(f"gaudi-launch {__version__}")
        raise typer.Exit()


@_app.command(help=HELP, context_settings={"allow_interspersed_args": False,
                                          "help_option_names": ["-h", "--help"]})
def launch(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, metavar="SCRIPT", help="Training script (or module with -m)."),
    script_args: Optional[List[str]] = typer.Argument(None, metavar="[SCRIPT_ARGS]...",
                                                      help="Passed to the script untouched."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", "--hostfile_path", help="DeepSpeed-style hostfile: 'HOST slots=N' per line. Default: this host only."),
    include: Optional[str] = typer.Option(None, "--include", "-i", help="Use only these hosts/devices: 'host1:0,2@host2'."),
    exclude: Optional[str] = typer.Option(None, "--exclude", "-e", help="Leave out these hosts/devices: 'host1:3@host2'."),
    num_nodes: Optional[int] = typer.Option(None, "--num_nodes", "--num-nodes", help="Use the first N hosts of the hostfile."),
    num_devices: Optional[int] = typer.Option(None, "--num_devices", "--num-devices", "--num_gpus", "--num-gpus", help="Devices (ranks) per node. Default: every slot, or the detected device count."),
    world_size: Optional[int] = typer.Option(None, "--world_size", "--world-size", help="gaudi_spawn.py's name for --num_devices."),
    nproc_per_node: Optional[str] = typer.Option(None, "--nproc-per-node", "--nproc_per_node", help="torchrun's name for --num_devices; also auto or gpu (the devices found) and cpu (this machine's CPUs)."),
    nnodes: Optional[str] = typer.Option(None, "--nnodes", help="torchrun's name for --num_nodes."),
    standalone: bool = typer.Option(False, "--standalone", help="torchrun's: accepted (one host needs no rendezvous service)."),
    ranks_filter: Optional[str] = typer.Option(None, "--local-ranks-filter", "--local_ranks_filter", "--ranks", help="Show only these ranks on the console, e.g. 0 or 0,3 (every rank still goes to --log-dir and to the failure summary)."),
    backend: str = typer.Option("auto", "--backend", help="auto, local, mpirun, deepspeed or slurm. auto: slurm inside a Slurm allocation without --hostfile, local for this host alone, else mpirun."),
    use_mpi: bool = typer.Option(False, "--use_mpi", "--use-mpi", help="gaudi_spawn.py: same as --backend mpirun."),
    use_deepspeed: bool = typer.Option(False, "--use_deepspeed", "--use-deepspeed", help="gaudi_spawn.py: same as --backend deepspeed."),
    master_addr: Optional[str] = typer.Option(None, "--master_addr", "--master-addr", help="Rendezvous address. Default: 127.0.0.1 locally, else the first host."),
    master_port: Optional[int] = typer.Option(None, "--master_port", "--master-port", help="Rendezvous port. Default: a free port picked on the master host."),
    env_file: Optional[str] = typer.Option(None, "--env-file", "--env_file", help="Read only this env file instead of ~/.deepspeed_env and ./.deepspeed_env."),
    env: Optional[List[str]] = typer.Option(None, "-x", "--env", help="KEY=VALUE for every rank, or KEY to pass this shell's value without putting it on a command line (repeatable); wins over env files."),
    module: bool = typer.Option(False, "--module", "-m", help="Run SCRIPT as a Python module (python -m)."),
    no_python: bool = typer.Option(False, "--no_python", "--no-python", help="SCRIPT is an executable, not a Python file."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter for the ranks. Default: this one."),
    append_local_rank: bool = typer.Option(False, "--append-local-rank", "--append_local_rank", help="Append --local_rank=N to the script's arguments (off by default; ranks read LOCAL_RANK)."),
    no_local_rank: bool = typer.Option(False, "--no_local_rank", "--no-local-rank", help="Accepted for DeepSpeed compatibility: this is already the default."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", "--log_dir", help="Also write each rank's output to DIR/rank-N.log."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when tearing the job down."),
    ssh_port: Optional[int] = typer.Option(None, "--ssh-port", "--ssh_port", help="SSH port of every host. Default: ~/.ssh/config, else 22 (DL1 containers: 3022)."),
    ssh_identity: Optional[str] = typer.Option(None, "--ssh-identity", "--ssh_identity", help="Private key for SSH. Default: ~/.ssh/config, then the usual keys and the agent."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", "--ssh_config", help="ssh_config file. Default: ~/.ssh/config."),
    ssh_timeout: float = typer.Option(10.0, "--ssh-timeout", "--ssh_timeout", help="SSH connect timeout in seconds."),
    strict_host_keys: bool = typer.Option(False, "--strict-host-keys", help="Refuse hosts whose key is not in known_hosts (default: accept new keys, refuse changed ones)."),
    no_ssh_check: bool = typer.Option(False, "--no-ssh-check", "--no_ssh_check", help="Skip the SSH pre-flight of every host."),
    wait_hosts: Optional[float] = typer.Option(None, "--wait-hosts", "--wait_hosts", help="Wait up to S seconds for every host's sshd to answer before the pre-flight (hosts that start with the job, e.g. containers)."),
    check_only: bool = typer.Option(False, "--check-only", "--check_only", help="Run the pre-flight only and print its table (exit 3 when a check fails)."),
    export_prefix: Optional[List[str]] = typer.Option(None, "--export-prefix", "--export_prefix", help="Also export this launcher's variables starting with PREFIX to every rank (repeatable)."),
    efa: Optional[bool] = typer.Option(None, "--efa/--no-efa", help="Set HCCL_OVER_OFI and the EFA libraries. Default: on when this host has EFA devices."),
    hccl_ofi_wrapper: Optional[str] = typer.Option(None, "--hccl-ofi-wrapper", "--hccl_ofi_wrapper", help="Directory of hccl_ofi_wrapper. Default: $HCCL_OFI_WRAPPER, else /root/hccl_ofi_wrapper."),
    launcher: str = typer.Option("pdsh", "--launcher", help="With --backend deepspeed: its multi-node runner, pdsh or openmpi."),
    launcher_args: Optional[str] = typer.Option(None, "--launcher-args", "--launcher_args", help="With --backend deepspeed: extra arguments for its runner (one string)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="With --backend slurm from a login node: srun's partition."),
    time: Optional[str] = typer.Option(None, "--time", help="With --backend slurm from a login node: srun's time limit (e.g. 1:00:00)."),
    account: Optional[str] = typer.Option(None, "--account", help="With --backend slurm from a login node: srun's account."),
    sbatch: Optional[str] = typer.Option(None, "--sbatch", help="With --backend slurm: write a batch script (and a private env file beside it) for this job instead of running it; submit it with sbatch."),
    slurm_args: Optional[str] = typer.Option(None, "--slurm-args", "--slurm_args", help="With --backend slurm: more srun options, one string (split like a shell would, never run by one)."),
    device: Optional[str] = typer.Option(None, "--device", help="hpu, cuda or cpu for the ranks' training runtime (default: what the host has)."),
    max_restarts: int = typer.Option(0, "--max-restarts", "--max_restarts", help="Start the job again after a failure, up to N times (torchrun's option); ranks get GAUDI_LAUNCH_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT, our Trainer resumes from its newest checkpoint."),
    restart_on: str = typer.Option("all", "--restart-on", "--restart_on", help="With --max-restarts: which failures restart, a list of rank, host, hang (default all)."),
    restart_backoff: float = typer.Option(1.0, "--restart-backoff", "--restart_backoff", help="With --max-restarts: seconds before the first restart, doubling after each (at most 60)."),
    spare_hosts: int = typer.Option(0, "--spare-hosts", "--spare_hosts", help="With --max-restarts: hold the last N selected hosts back; one takes a lost host's place on the restart, so the world size stays."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", "--min_nodes", help="With --max-restarts: when a host is lost and no spare is left, restart on the hosts left if there are at least M (else exit 4)."),
    hang_timeout: Optional[float] = typer.Option(None, "--hang-timeout", "--hang_timeout", help="When no rank on this host advanced for S seconds (heartbeats: our Trainer's steps, gaudi_launch.heartbeat() in a script), print where every rank waits, keep their stacks in --log-dir, and tear the job down (exit 5). Default: off."),
    dry_run: bool = typer.Option(False, "--dry-run", "--dry_run", help="Print the plan; start nothing."),
    json_out: bool = typer.Option(False, "--json", help="With --dry-run: print the plan as one JSON object."),
    config: Optional[str] = typer.Option(None, "--config", help="YAML job file holding any of these options; the command line wins."),
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
) -> int:
    values = dict(ctx.params)
    if config:
        _apply_config(ctx, values, config)
    if no_local_rank and values["append_local_rank"]:
        raise UserError("--no_local_rank and --append-local-rank contradict each other", where="--no_local_rank")
    return _launch(values)


def _apply_config(ctx: click.Context, values: dict, path: str) -> None:
    from gaudi_launch.config import load_config

    params = {p.name: p for p in ctx.command.params}
    for name, raw, where in load_config(path):
        param = params.get(name)
        if param is None or name in ("config", "version", "ctx"):
            raise UserError(f"unknown option '{name}'", where=where,
                            hint="keys are the long option names, e.g. hostfile, num_devices, master_port")
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            continue  # the command line wins
        if name == "script_args" and ctx.get_parameter_source("script") not in (ParameterSource.DEFAULT, None):
            continue  # a script given on the command line brings its own arguments
        values[name] = _config_value(ctx, param, name, raw, where)


def _config_value(ctx: click.Context, param: click.Parameter, name: str, raw, where: str):
    """A YAML value checked as strictly as the same option on the command line."""
    if name == "env" and isinstance(raw, dict):
        raw = [f"{k}={'' if v is None else v}" for k, v in raw.items()]
    many = param.multiple or param.nargs == -1
    if many and not isinstance(raw, list):
        raise UserError(f"{name} is a list", where=where, hint=f"{name}: [a, b]")
    if not many and isinstance(raw, (list, dict)):
        raise UserError(f"{name} takes a single value, not a {type(raw).__name__}", where=where)
    items = raw if many else [raw]
    if any(v is None for v in items):  # YAML null: click would pass None on and fail much later
        raise UserError(f"{name} has no value", where=where, hint=f"give {name} a value, or leave the key out")
    if isinstance(param.type, click.types.BoolParamType) and not all(isinstance(v, bool) for v in items):
        raise UserError(f"{name} is true or false, got {raw!r}", where=where)
    if isinstance(param.type, click.types.IntParamType) and any(isinstance(v, (bool, float)) for v in items):
        raise UserError(f"{name} must be a whole number", where=where)
    if name == "env":
        _check_env_items(items, where)
    if isinstance(param.type, click.types.StringParamType):
        if any(isinstance(v, (list, dict)) for v in items):
            raise UserError(f"{name} takes text, not a nested list or mapping", where=where)
        items = [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in items]
        raw = items if many else items[0]
    try:
        return param.type_cast_value(ctx, raw)
    except (click.BadParameter, TypeError, ValueError) as exc:
        raise UserError(f"bad value for {name}: {getattr(exc, 'message', exc)}", where=where)


def _check_env_items(items: list, where: str) -> None:
    """A job file's env items, checked here so that errors name the job file's line."""
    from gaudi_launch.envfile import parse_assignments

    hint = 'env: {NAME: "value"} or env: ["NAME=value"]'
    if not all(isinstance(v, str) for v in items):
        raise UserError("env items are NAME=VALUE text", where=where, hint=hint)
    try:
        parse_assignments(items, "env", environ=os.environ)
    except UserError as exc:
        raise UserError(exc.message, where=where, hint=hint) from None


def _launch(v: dict) -> int:
    from gaudi_launch.envfile import parse_assignments
    from gaudi_launch.spec import JobSpec, resolve_compat

    if not v["script"] and not v["check_only"]:
        raise UserError("no training script given", where="SCRIPT",
                        hint="gaudi-launch [OPTIONS] train.py [SCRIPT_ARGS]...  (see --help)")
    from gaudi_launch import habits

    num_devices, num_nodes = v["num_devices"], v["num_nodes"]
    if v["nproc_per_node"] is not None:
        if num_devices is not None:
            raise UserError("--nproc-per-node and --num_devices say the same thing: give one", where="--nproc-per-node")
        num_devices = habits.nproc_per_node(v["nproc_per_node"])
    if v["nnodes"] is not None:
        if num_nodes is not None:
            raise UserError("--nnodes and --num_nodes say the same thing: give one", where="--nnodes")
        num_nodes = habits.nnodes(v["nnodes"])
    backend, num_devices = resolve_compat(backend=v["backend"], use_mpi=v["use_mpi"],
                                          use_deepspeed=v["use_deepspeed"], world_size=v["world_size"],
                                          num_devices=num_devices)
    if v["json_out"] and not v["dry_run"]:
        raise UserError("--json only applies to --dry-run", where="--json")
    program = [v["script"], *(v["script_args"] or [])] if v["script"] else []
    if (program and not v["dry_run"] and not v["hostfile"] and backend in ("auto", "local")
            and not os.environ.get("SLURM_JOB_ID")):
        # this machine runs the ranks: a script that is not here fails now, not once per rank
        habits.check_program(program, module=v["module"], no_python=v["no_python"], cwd=os.getcwd())
    if program and not v["dry_run"]:
        for note in habits.notes(program, module=v["module"], no_python=v["no_python"], cwd=os.getcwd(),
                                 append_local_rank=v["append_local_rank"], launcher_options=_option_names()):
            print(f"gaudi-launch: note: {note}", file=sys.stderr)
    spec = JobSpec(
        program=program, module=v["module"], no_python=v["no_python"],
        hostfile=v["hostfile"], include=v["include"], exclude=v["exclude"], num_nodes=num_nodes,
        num_devices=num_devices, backend=backend, master_addr=v["master_addr"],
        master_port=v["master_port"], env_file=v["env_file"],
        env={**parse_assignments(v["env"] or [], "-x", environ=os.environ), **_device_env(v["device"])},
        append_local_rank=v["append_local_rank"], log_dir=v["log_dir"], grace=v["grace"],
        ssh_port=v["ssh_port"], ssh_identity=v["ssh_identity"], ssh_config=v["ssh_config"],
        ssh_timeout=v["ssh_timeout"], strict_host_keys=v["strict_host_keys"], ssh_check=not v["no_ssh_check"],
        wait_hosts=v["wait_hosts"],
        export_prefixes=list(v["export_prefix"] or []), efa=v["efa"], hccl_ofi_wrapper=v["hccl_ofi_wrapper"],
        launcher=v["launcher"], launcher_args=v["launcher_args"], partition=v["partition"],
        time=v["time"], account=v["account"], slurm_args=v["slurm_args"], sbatch=v["sbatch"],
        console_ranks=_ranks(v["ranks_filter"]), max_restarts=v["max_restarts"], restart_on=v["restart_on"],
        restart_backoff=v["restart_backoff"], hang_timeout=v["hang_timeout"], spare_hosts=v["spare_hosts"],
        min_nodes=v["min_nodes"])
    if v["python"]:
        spec.python = v["python"]
    if v["check_only"] and v["no_ssh_check"]:
        raise UserError("--check-only and --no-ssh-check contradict each other", where="--check-only")
    return run_spec(spec, dry_run=v["dry_run"], json_out=v["json_out"], check_only=v["check_only"])


def _ranks(text: Optional[str]) -> Optional[List[int]]:
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


def run_spec(spec, *, dry_run: bool = False, json_out: bool = False, check_only: bool = False) -> int:
    from gaudi_launch.launch import launch, plan_job, preflight_for, prepare
    from gaudi_launch.planner import build_plan

    spec = prepare(spec)
    if check_only:
        plan = build_plan(spec, require_program=False)
        if plan.backend == "slurm":  # no hostfile, no ssh: the nodes are probed through srun
            raise UserError("the pre-flight checks a hostfile's hosts over ssh; a Slurm job has neither",
                            where="--check-only", hint="inside the allocation, --dry-run shows what srun found "
                                                       "on the nodes (interface, addresses)")
        report = preflight_for(spec)(plan, spec)
        table = report.render_table()
        sys.stdout.write(table if table.endswith("\n") else table + "\n")
        return ExitCode.OK if report.ok else ExitCode.PREFLIGHT
    plan = plan_job(spec, keep_failed_preflight=dry_run)
    if dry_run:  # the plan whatever the pre-flight said, its findings with it; exit 3 if it failed
        sys.stdout.write(plan.to_json() + "\n" if json_out else plan.render_text())
        if plan.preflight is not None and not plan.preflight["ok"]:
            print("gaudi-launch: pre-flight failed: a real run would start nothing (findings in the plan)",
                  file=sys.stderr)
            return ExitCode.PREFLIGHT
        return 0
    if spec.sbatch:  # a batch script for the job, nothing started
        from gaudi_launch.sbatch import write

        if plan.backend != "slurm":
            raise UserError("--sbatch writes a Slurm batch script", where="--sbatch", hint="add --backend slurm")

        written = write(plan, spec, os.environ)
        print(f"gaudi-launch: wrote {written['script']} and {written['env_file']}; submit with: sbatch "
              f"{written['script']}", file=sys.stderr)
        return 0
    return launch(spec, plan, announce=True).exit_code


def _option_names() -> List[str]:
    """Every long option of the launch command (for the 'option after the script' note)."""
    command = typer.main.get_command(_app)
    return [name for p in command.params for name in getattr(p, "opts", []) if name.startswith("--")]


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:  # `gaudi-launch check [OPTIONS] [SCRIPT]` = --check-only
        if any(a in ("-h", "--help") for a in argv[1:]):
            print(CHECK_HELP, end="")
            return 0
        argv = ["--check-only", *argv[1:]]
    if argv[:1] == ["env"]:  # `gaudi-launch env [--json]`: versions and devices, for bug reports
        from gaudi_launch.envreport import main as env_main

        return env_main(argv[1:])
    if argv[:1] == ["report"]:  # `gaudi-launch report RUN_DIR [--out DIR]`: plots (matplotlib, imported there)
        from gaudi_launch.report import main as report_main

        return report_main(argv[1:])
    command = typer.main.get_command(_app)
    try:
        return command.main(args=argv, prog_name="gaudi-launch", standalone_mode=False) or 0
    except UserError as exc:
        print(f"gaudi-launch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.NoSuchOption as exc:
        from gaudi_launch.habits import torchrun_option_error

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
        print(f"gaudi-launch: internal error: {type(exc).__name__}: {exc}\n"
              "  hint: rerun with GAUDI_LAUNCH_DEBUG=1 for the traceback and please report it",
              file=sys.stderr)
        return ExitCode.INTERNAL
