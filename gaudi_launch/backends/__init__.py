"""Backends turn a plan into processes, behind one interface (``Backend``), found by name.

A backend is a module of this package with a pure ``commands(plan, spec, environ)`` (what it would
start: the dry run shows it) and ``run(plan, spec, environ=None, **supervisor_options)`` (starts
them, supervises the job, tears it down; returns a JobResult). Modules are imported on first use,
so a job pays only for its own backend.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, List, Mapping, Optional, Protocol, cast

if TYPE_CHECKING:
    from gaudi_launch.plan.launchplan import Command, LaunchPlan
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.process.supervise import JobResult

NAMES = ("local", "mpirun", "deepspeed", "slurm")


class Backend(Protocol):
    def commands(self, plan: "LaunchPlan", spec: "JobSpec", environ: Mapping[str, str]) -> "List[Command]": ...

    def run(self, plan: "LaunchPlan", spec: "JobSpec", environ: Optional[Mapping[str, str]] = None,
            **supervisor_options) -> "JobResult": ...


def get_backend(name: str) -> Backend:
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}")
    return cast(Backend, importlib.import_module(f"gaudi_launch.backends.{name}"))
