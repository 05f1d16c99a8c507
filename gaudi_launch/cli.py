"""``gaudi-launch``: read the command line and run the command; every error said in one line.

A plain launch line (``[check] [OPTIONS] SCRIPT [SCRIPT_ARGS]...``) is read here without Typer (plainline.py):
Typer, click and pydantic cost a launch about 0.1 s before the first word, and drawing its help through rich
0.3 s (helptext.py draws the launch and check commands' help instead). Any other line (completion, --version,
a misspelt option, the other commands) goes to the Typer command (typercli.py), which reads every line the same
way and says what is wrong. commands.py runs either.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from typing import Optional

from gaudi_launch import commands, completion, plainline
from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode, for_signal
from gaudi_launch.wire import DEBUG

HELP = commands.HELP


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plain = None if completion.requested() else plainline.read(argv, commands.checked())
        if plain is None:
            from gaudi_launch import typercli  # only here: the plain launch line never pays for Typer

            return typercli.read(argv)
        command, given = plain
        if given.get(plainline.HELP):
            print(commands.help_page(command, shutil.get_terminal_size().columns), end="")
            return 0
        return commands.check(given) if command == "check" else commands.launch(given)
    except UserError as exc:
        print(f"gaudi-launch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gaudi-launch: interrupted", file=sys.stderr)
        return for_signal(signal.SIGINT)
    except Exception as exc:  # a bug of ours: say so briefly; the traceback on request
        if os.environ.get(DEBUG):
            raise
        print(
            f"gaudi-launch: internal error: {type(exc).__name__}: {exc}\n"
            "  hint: rerun with GAUDI_LAUNCH_DEBUG=1 for the traceback and please report it",
            file=sys.stderr,
        )
        return ExitCode.INTERNAL
