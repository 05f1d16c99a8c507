"""Static checks find nothing: ruff's lint and its formatter ([tool.ruff] in pyproject.toml) over the
whole repository, and mypy ([tool.mypy]: the launcher, gaudi_launch but its runtime)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_tool(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m module args`` in the repository; a missing tool fails under CI, else skips."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed (pip install -e '.[dev]')")
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_ruff_finds_nothing():
    res = run_tool("ruff", "check", "--no-cache", ".", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_would_change_nothing():
    res = run_tool("ruff", "format", "--check", "--no-cache", ".", timeout=120)
    assert res.returncode == 0, "run `ruff format .`:\n" + res.stdout + res.stderr


def test_mypy_finds_nothing():
    # The files and options are the config's alone; a note (e.g. an unchecked function body) fails too.
    res = run_tool("mypy", "--no-error-summary", timeout=600)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
