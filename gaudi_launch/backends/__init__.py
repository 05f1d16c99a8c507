"""Backends turn a plan into processes, behind one interface (``Backend``), found by name.

A backend is a module of this package with three functions that read the plan only (its ``job`` is
the JobSpec it was made from): ``detect(plan, environ)``, the backend's one look at this host while
planning (it records what it found in the plan, and returns the facts of the hosts it read, HostFacts by
host, when no pre-flight reads them: local reads this host, slurm its nodes through srun); a pure ``commands(plan, environ)`` (what it would
start: the dry run shows it); and ``run(plan, environ=None, **supervisor_options)``, the I/O: starts
the commands under the supervisor (``process.supervise.supervise_job``, with the backend's ``Hooks``),
tears the job down and returns a JobResult. Modules are imported on first use, so a job pays only
for its own backend. Which backends there are, and what each can do, the registry says
(inputs/backend_options.py ``BACKENDS``): a new backend is a module here and an entry there.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional, Protocol, cast

from gaudi_launch.inputs.backend_options import BACKENDS

if TYPE_CHECKING:
    from gaudi_launch.plan.hostfacts import HostFacts
    from gaudi_launch.plan.launchplan import Command, LaunchPlan
    from gaudi_launch.process.supervise import JobResult

NAMES = tuple(BACKENDS)  # those shipped (a test may register more)


class Backend(Protocol):
    def detect(self, plan: LaunchPlan, environ: Mapping[str, str]) -> Optional[Mapping[str, HostFacts]]: ...

    def commands(self, plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]: ...

    def run(self, plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options) -> JobResult: ...


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    return cast(Backend, importlib.import_module(BACKENDS[name].module))
