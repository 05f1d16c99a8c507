"""ruff (pyflakes and syntax errors, [tool.ruff] in pyproject.toml) finds nothing in gaudi_launch."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ruff is not installed (pip install -e '.[dev]')")
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "gaudi_launch"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
