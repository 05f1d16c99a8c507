"""`gaudi-launch --version` says what is installed: the distribution's metadata, which pyproject takes from
gaudi_launch.__version__ (one place)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import re

from gaudi_launch import __version__
from gaudi_launch.cli import main


def version_line(argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue().strip()


def test_version_is_the_installed_metadata(monkeypatch):
    assert importlib.metadata.version("gaudi-launch") == __version__  # pyproject's dynamic version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7" if name == "gaudi-launch" else "?")
    assert version_line(["--version"]) == "gaudi-launch 9.8.7"


def test_version_from_a_source_tree_never_installed(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version_line(["-V"]) == f"gaudi-launch {__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-].*)?", __version__)
