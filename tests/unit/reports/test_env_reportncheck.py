"""`gaudi-launch env` runs Habana's ReportNCheck when it is installed and shows its verdict (issue 24, item 8),
here the stand-in tests/standin/perftest/reportNcheck.py (its output is made up: Habana's page shows none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gaudi_launch.reports import environment
from tests.standin import gaudi_tools

TOOL = os.path.join(gaudi_tools.PERFTEST, "reportNcheck.py")


def env_command(tmp_path, verdict: str, *args: str) -> str:
    values = gaudi_tools.settings("gaudi2", os.environ["PATH"], GAUDI_STANDIN_REPORTNCHECK=verdict)
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "env", *args],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        env={**os.environ, **values},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_env_shows_reportncheck_passing_and_failing_verdicts(tmp_path):
    text = env_command(tmp_path, "pass")
    assert f"ReportNCheck             OK: Connectivity check PASSED: 24 of 24 ports ({TOOL} -c)" in text
    text = env_command(tmp_path, "fail")
    assert (
        "ReportNCheck             FAILED: Connectivity check FAILED: 1 of 24 ports (hbl_1:9) (exit 1) "
        f"({TOOL} -c)" in text
    )
    info = json.loads(env_command(tmp_path, "fail", "--json"))
    assert info["reportncheck"] == {
        "tool": TOOL,
        "ok": False,
        "verdict": "Connectivity check FAILED: 1 of 24 ports (hbl_1:9) (exit 1)",
    }


def test_env_runs_reportncheck_with_python3_from_path(tmp_path, monkeypatch):
    # the page runs it as `python3 reportNcheck.py`: the python3 where its pandas is, not gaudi-launch's venv
    ran = tmp_path / "ran"
    python3 = tmp_path / "python3"
    python3.write_text(f'#!/bin/sh\necho "$@" > {ran}\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    gaudi_tools.apply(monkeypatch, "gaudi2", GAUDI_STANDIN_REPORTNCHECK="pass")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert environment._reportncheck()["ok"] is True
    assert ran.read_text().split() == [TOOL, "-c"]


def test_env_report_comes_back_when_reportncheck_hangs(tmp_path, monkeypatch, capsys):
    gaudi_tools.apply(monkeypatch, "gaudi2", GAUDI_STANDIN_REPORTNCHECK="hang")
    monkeypatch.setattr(environment, "REPORTNCHECK_TIMEOUT_S", 1)
    assert environment.report() == 0
    assert f"ReportNCheck             FAILED: timed out after 1 s (no verdict) ({TOOL} -c)" in capsys.readouterr().out
