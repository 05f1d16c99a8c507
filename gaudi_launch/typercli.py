"""The ``gaudi-launch`` command line on Typer: help, completion, errors and every command but a plain launch line.

The launch command's signature is generated from the option fields (inputs/commandline.py: JobSpec's
and the command line's own), each in its --help panel; everything after SCRIPT is the script's own argv,
passed on byte for byte. ``check``, ``run``, ``env``, ``report`` and ``completion`` are commands of the
same app; any other first word starts the launch command (``gaudi-launch train.py``). Values arrive as
typed (text) and are checked against their fields' types in inputs/, for the job file alike. No torch
here, and nothing of the launch itself until a command runs: --help stays fast. cli.py comes here for any line
plainline.py does not read itself; ``env`` and ``report`` call reports/ from here.
"""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any, Callable, Optional

import typer

from gaudi_launch import commands, completion, helptext
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.commandline import kind_of, launch_options
from gaudi_launch.inputs.habits import torchrun_option_error
from gaudi_launch.reports.environment import report as environment_report
from gaudi_launch.reports.plots import report as plots_report

COMMANDS = commands.COMMANDS
HELP, CHECK_HELP, PROG = commands.HELP, commands.CHECK_HELP, commands.PROG
SETTINGS = {"help_option_names": ["-h", "--help"]}


def _markup(text: str) -> str:
    """Help text as rich shows it literally ('[' opens rich markup)."""
    return text.replace("[", "\\[")


def _parameters(helps: Optional[dict[str, str]] = None, only: Optional[set[str]] = None) -> list[inspect.Parameter]:
    """The launch command's signature: one keyword per option field (those named in ``only``, when given),
    then SCRIPT and SCRIPT_ARGS. Every option is text (or a flag): launch.py checks it against its field's
    type, as for the job file."""
    params = []
    for o in launch_options():
        if only is not None and o.name not in only:
            continue
        kind, many = kind_of(o.hint)
        info = typer.Option(
            *o.option.flags,
            help=_markup(helptext.shown_help(o, helps)),
            rich_help_panel=o.option.panel,
            metavar=helptext.metavar(o),  # a flag takes no value: none shown
            show_default=False,
        )
        annotation = Optional[bool] if kind is bool else Optional[list[str]] if many else Optional[str]
        params.append(_keyword(o.name, annotation, info))
    params.append(
        _keyword(
            "version",
            Optional[bool],
            typer.Option(
                "--version", "-V", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
            ),
        )
    )
    # Described in HELP, not in a panel of their own (which would show Typer's '<str>' type for them).
    script = typer.Argument(metavar="SCRIPT", hidden=True, show_default=False)
    rest = typer.Argument(metavar="SCRIPT_ARGS", hidden=True, show_default=False)
    return params + [_keyword("script", Optional[str], script), _keyword("script_args", Optional[list[str]], rest)]


def _named_in(argv: list[str]) -> Optional[set[str]]:
    """The options whose flags occur in ``argv`` (a word, or its part before '='), or None (all) when help may be
    asked for. Typer 0.29 builds a pydantic adapter for every option of a command, given or not (0.1 s for this
    one's 70): a command made of the given options alone parses the same argv the same way. Words of the
    script's own may name an option too: one more parameter, never one fewer. Pure."""
    words = {w.split("=", 1)[0] for w in argv} | {w[:2] for w in argv if w[:1] == "-" and w[:2] != "--"}  # -xA=B
    if words & set(SETTINGS["help_option_names"]):
        return None
    return {o.name for o in launch_options() if words & {s for f in o.option.flags for s in f.split("/")}}


def _keyword(name: str, annotation, info) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[annotation, info])


def _version(value: Optional[bool]) -> None:
    if value:
        typer.echo(f"{PROG} {commands.installed_version()}")
        raise typer.Exit()


def _with_signature(function: Callable, params: list[inspect.Parameter]) -> Callable:
    """``function(**values)`` as Typer reads it: the generated signature, and annotations to match."""
    function.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in params}
    return function


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """What the command line gave: an option not given arrives as None."""
    return {k: v for k, v in values.items() if v is not None and k != "version"}


def _launch(**values) -> int:
    return commands.launch(_given(values))


def _check(**values) -> int:
    return commands.check(_given(values))


def run_plan(
    plan: Annotated[Optional[str], typer.Argument(metavar="PLAN", hidden=True, show_default=False)] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "--dry_run", metavar="", help="Show the plan made now; start nothing.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", metavar="", help="With --dry-run: as one JSON object.")] = False,
) -> int:
    """Run PLAN, the plan a dry run wrote (gaudi-launch --dry-run --json ... > plan.json), in its directory, with
    all its options; nothing starts if the job planned now differs from it."""
    if plan is None:
        raise UserError(
            "run takes one plan: gaudi-launch run [--dry-run [--json]] plan.json",
            hint="make one with: gaudi-launch --dry-run --json [OPTIONS] SCRIPT > plan.json",
        )
    return commands.interruptible(lambda: commands.root().replay(plan, dry_run=dry_run, json_out=json_out))


def env(
    json_out: Annotated[bool, typer.Option("--json", metavar="", help="One JSON object instead of text.")] = False,
    hostfile: Annotated[
        Optional[str],
        typer.Option("--hostfile", metavar="TEXT", help="Report every host of this hostfile, differences marked."),
    ] = None,
    ssh_config: Annotated[
        Optional[str], typer.Option("--ssh-config", "--ssh_config", metavar="TEXT", help="ssh_config file.")
    ] = None,
    ssh_port: Annotated[
        Optional[int], typer.Option("--ssh-port", "--ssh_port", metavar="INTEGER", help="SSH port of every host.")
    ] = None,
    ssh_identity: Annotated[
        Optional[str], typer.Option("--ssh-identity", "--ssh_identity", metavar="TEXT", help="Private key for SSH.")
    ] = None,
    python: Annotated[
        Optional[str],
        typer.Option("--python", metavar="TEXT", help="gaudi-launch's interpreter on the hosts. Default: this one."),
    ] = None,
) -> int:
    """Versions, devices and network of this machine (or of every host of a hostfile), for bug reports."""
    return environment_report(
        json_out=json_out,
        hostfile=hostfile,
        ssh_config=ssh_config,
        ssh_port=ssh_port,
        ssh_identity=ssh_identity,
        python=python or sys.executable,
    )


def report(
    source: Annotated[Optional[str], typer.Argument(metavar="RUN_DIR", hidden=True, show_default=False)] = None,
    out: Annotated[
        Optional[str],
        typer.Option(
            "--out",
            metavar="DIR",
            help="Directory for the PNGs (default: RUN_DIR/plots, or plots/ beside a JSON file).",
        ),
    ] = None,
) -> int:
    """PNG plots of RUN_DIR: a run's output directory or its metrics.jsonl (loss, throughput, memory over steps),
    or a benchmark JSON from scripts/bench/ (bars with ratios against the peer)."""
    if source is None:
        raise UserError("report takes a run's directory: gaudi-launch report RUN_DIR [--out DIR]", where="RUN_DIR")
    return plots_report(source, out)  # matplotlib is imported there, when plotting


def completion_command(
    shell: Annotated[Optional[str], typer.Argument(metavar="SHELL", hidden=True, show_default=False)] = None,
    install: Annotated[bool, typer.Option("--install", metavar="", help="Write it where the shell reads it.")] = False,
) -> int:
    """Print the shell completion script for gaudi-launch for SHELL (bash, zsh or fish; default: $SHELL's), or
    install it (--install)."""
    return completion.install(_app_command(), shell) if install else completion.show(_app_command(), shell)


def app(only: Optional[set[str]] = None) -> typer.Typer:
    """The app: the launch command (also the default one, see read), check, run, env, report, completion
    (``only``: the options launch and check declare, see _named_in)."""
    group = typer.Typer(name=PROG, add_completion=False, context_settings=SETTINGS, rich_markup_mode="rich")
    script_first = {**SETTINGS, "allow_interspersed_args": False}  # after SCRIPT, every word is the script's
    launch = _with_signature(_launch, _parameters(only=only))
    group.command("launch", context_settings=script_first, help=HELP)(launch)
    json_help = {"json_out": "With --collective: its results as one JSON object."}
    check_params = [p for p in _parameters(json_help, only) if p.name in commands.checked()]
    group.command("check", context_settings=script_first, help=CHECK_HELP)(_with_signature(_check, check_params))
    group.command("run")(run_plan)
    group.command("env")(env)
    group.command("report")(report)
    group.command("completion")(completion_command)
    return group


def _app_command(only: Optional[set[str]] = None):
    """The launch command alone, as ``gaudi-launch [OPTIONS] SCRIPT [SCRIPT_ARGS]...`` runs it (``only``: its
    options, see _named_in)."""
    alone = typer.Typer(
        name=PROG,
        add_completion=True,  # Typer's --install-completion/--show-completion (the shell found), its answers
        rich_markup_mode="rich",
        context_settings={**SETTINGS, "allow_interspersed_args": False},
    )
    alone.command(help=HELP)(_with_signature(_launch, _parameters(only=only)))
    return typer.main.get_command(alone)


def _command(argv: list[str], only: Optional[set[str]]):
    if argv[:1] and argv[0] in COMMANDS:
        return typer.main.get_command(app(only))
    return _app_command(only)  # gaudi-launch [OPTIONS] SCRIPT [SCRIPT_ARGS]...: the launch command


def read(argv: list[str]) -> int:
    """Run ``argv`` through the Typer command: its own errors (unknown option, missing value) said with a hint,
    help and completion answered. A UserError or an error of ours is cli.main's to say."""
    if not (argv[:1] and argv[0] in COMMANDS) and completion.old_request():
        return 1
    only = None if completion.requested() else _named_in(argv)
    try:
        try:
            return _command(argv, only).main(args=argv, prog_name=PROG, standalone_mode=False) or 0
        except typer.TyperException:
            if only is None:
                raise
            # the command line's own error: said by the whole command, whose words it suggests from
            return _command(argv, None).main(args=argv, prog_name=PROG, standalone_mode=False) or 0
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # the command line's own: unknown option, missing value
        known = torchrun_option_error(getattr(exc, "option_name", None) or "")
        if known is not None:
            print(f"gaudi-launch: error: {known}", file=sys.stderr)
            return known.exit_code
        where = getattr(getattr(exc, "ctx", None), "command_path", None) or PROG
        print(f"gaudi-launch: error: {exc.format_message()}\n  hint: see {where} --help", file=sys.stderr)
        return exc.exit_code if exc.exit_code != 1 else ExitCode.USAGE
    except typer.Abort:
        raise KeyboardInterrupt from None
    except SystemExit as exc:  # typer's completion answers exit
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
