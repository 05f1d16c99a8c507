"""What each command of ``gaudi-launch`` does once its line is read, and the words --help shows: no Typer.

cli.py reads a plain launch line itself (plainline.py) and any other through Typer (typercli.py); both end
here. launch.py, the composition root, is imported when a command runs, never for --help.
"""

from __future__ import annotations

import signal
import sys
from types import ModuleType
from typing import Any, Callable

from gaudi_launch import helptext
from gaudi_launch.exitcodes import for_signal
from gaudi_launch.inputs.commandline import EXTRA_OPTIONS, launch_options
from gaudi_launch.version import __version__

PROG = "gaudi-launch"
HELP = """Launch SCRIPT on every selected device of every host, one process per device. SCRIPT is a Python
file (a module with -m, an executable with --no_python); every word after it is passed to it untouched.

Examples:

  gaudi-launch --num_devices 8 train.py --bf16          (this host, 8 ranks)

  gaudi-launch --hostfile hostfiles/two-dl1-nodes train.py --epochs 3

  gaudi-launch --hostfile H --include 'worker-0:0,1@worker-1' --dry-run train.py

Commands (gaudi-launch COMMAND --help):

  check --hostfile H train.py     the pre-flight alone (same as --check-only)

  run plan.json                   run what --dry-run --json wrote, as it was

  env \\[--json]                    versions, devices, network: paste it into bug reports

  report RUN_DIR                  plots of a run's metrics.jsonl or a bench JSON

  completion \\[SHELL] \\[--install]  shell completion (bash, zsh, fish)

Exit status: 0 on success; the first failing rank's exit code (128+N for signal N);
1 for a bug of gaudi-launch (GAUDI_LAUNCH_DEBUG=1 shows it); 2 for bad input or options;
3 when the pre-flight failed (nothing started); 4 when a host stopped answering mid-run;
5 when no rank advanced for --hang-timeout seconds; 127 when a rank's program could not be started;
128+N when the launcher itself got signal N.
"""
CHECK_HELP = """The pre-flight alone: reach every selected host over SSH and check its Python, the script, the
working directory, its Gaudi devices (hl-smi), the master port and the network interface; print the table and
exit 0, or 3 when a check failed. Nothing is started. (Same as --check-only.) With --collective: also the
fabric test, one rank per host."""
COMMANDS = ("check", "run", "env", "report", "completion", "launch")
CHECK_HELPS = {"json_out": "With --collective: its results as one JSON object."}  # check's words for an option
SCRIPT_ARGS = ("script", "script_args")


def checked() -> set[str]:
    """The options ``check`` takes: what the pre-flight (and its collective test) reads."""
    wanted = [o.name for o in launch_options() if o.option.panel in ("Hosts", "Devices", "SSH")]
    return {*wanted, "python", "config", "json_out", "version", *SCRIPT_ARGS} - {"check_only", "no_ssh_check"}


def help_page(command: str, width: int) -> str:
    """``gaudi-launch --help`` or ``gaudi-launch check --help``, drawn by helptext.py."""
    if command == "check":
        only = checked()
        options = [o for o in launch_options() if o.name in only]
        extras = [e for e in EXTRA_OPTIONS if "completion" not in e.flags[0]]  # check has no completion flags
        usage = f"{PROG} check [OPTIONS] [SCRIPT] [SCRIPT_ARGS]..."
        return helptext.render(usage, CHECK_HELP, options, width, extras, CHECK_HELPS)
    return helptext.render(f"{PROG} [OPTIONS] [SCRIPT] [SCRIPT_ARGS]...", HELP, launch_options(), width, EXTRA_OPTIONS)


def installed_version() -> str:
    """The installed distribution's version (its metadata, what pip shows); ``__version__`` when run from a
    source tree that was never installed. pyproject takes its version from ``__version__``, so they agree."""
    from importlib.metadata import PackageNotFoundError, version  # only here: --help stays fast

    try:
        return version(PROG)
    except PackageNotFoundError:
        return __version__


def root() -> ModuleType:
    """launch.py, the composition root, and with it the launch's modules: imported when a command runs,
    never for --help (the one function-level import here)."""
    from gaudi_launch import launch

    return launch


def interruptible(call: Callable[[], int]) -> int:
    """A command's work; Ctrl-C is said as such (Typer would turn it into a silent exit 130)."""
    try:
        return call()
    except KeyboardInterrupt:
        print("gaudi-launch: interrupted", file=sys.stderr)
        return for_signal(signal.SIGINT)


def launch(given: dict[str, Any]) -> int:
    """The launch command, with the options its line gave."""
    return interruptible(lambda: root().run_command(given))


def check(given: dict[str, Any]) -> int:
    """``check``: the launch command's pre-flight alone."""
    return interruptible(lambda: root().run_command({**given, "check_only": True}))
