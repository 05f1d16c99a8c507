"""Backends turn a plan into processes. Each module has a pure ``commands(plan, spec)`` and ``run``."""
from __future__ import annotations

import importlib
from types import ModuleType

NAMES = ("local", "mpirun", "deepspeed", "slurm")


def get_backend(name: str) -> ModuleType:
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}")
    return importlib.import_module(f"gaudi_launch.backends.{name}")
