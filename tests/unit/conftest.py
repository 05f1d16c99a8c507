"""Shared isolation for tests that drive the CLI in-process: an empty HOME and working directory
(so no real ~/.deepspeed_env or ./.deepspeed_env is read) and a fixed device count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    home = tmp_path / "home"
    cwd = tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    for name in ("DS_ENV_FILE", "GAUDI_LAUNCH_DEBUG", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1,2,3")
    return SimpleNamespace(home=home, cwd=cwd, tmp=tmp_path)
