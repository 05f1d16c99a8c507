"""`gaudi-launch env` lists the packages the launcher really runs on (Typer, not the click it replaced)."""

from __future__ import annotations

from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from gaudi_launch.reports.environment import PACKAGES

ROOT = Path(__file__).resolve().parents[3]


def test_every_dependency_of_the_launcher_is_listed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        assert Requirement(text).name in PACKAGES, text
    assert "click" not in PACKAGES  # gone since the CLI moved to Typer (it ships its own)
