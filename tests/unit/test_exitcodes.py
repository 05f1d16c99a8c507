"""The README's exit-status table and gaudi_launch.exitcodes say the same."""

from __future__ import annotations

import os
import re
import signal

from gaudi_launch.exitcodes import ExitCode, for_signal
from gaudi_launch.process.failures import exit_code_for

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def readme_table() -> dict:
    text = open(README).read()
    section = text.split("### Exit status", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (\S+) \| (.+) \|$", section, re.M)
    return {code: meaning for code, meaning in rows if code != "code" and not code.startswith("-")}


def test_every_fixed_code_is_in_the_readme_and_back():
    table = readme_table()
    fixed = {str(int(c)) for c in ExitCode if c is not ExitCode.SIGNAL_BASE}
    numbered = {c for c in table if c.isdigit()}
    assert numbered == fixed, (numbered, fixed)
    assert "128+N" in table and "N" in table  # the two families: a signal, the rank's own code


def test_signals_follow_the_shell_convention():
    assert for_signal(signal.SIGINT) == 130
    assert exit_code_for(-signal.SIGKILL) == 137 and exit_code_for(3) == 3


def test_help_lists_every_fixed_code():
    from gaudi_launch.cli import HELP

    status = HELP.split("Exit status:", 1)[1]
    for code in ExitCode:
        if code is not ExitCode.SIGNAL_BASE:
            assert re.search(rf"(?<![\d+]){int(code)}\b", status), f"--help's exit status lacks {int(code)}"
