"""A test's backend, in tests/ only: what a pdsh-like backend (DeepSpeed has one) would be, one ``pdsh -w``
command that starts the bootstrap on every node over ssh. Registered by tests/unit/test_backend_caps.py
with ``backend_options.register`` and planned with --dry-run: it shows that a new backend is a module and a
registry entry, and that the core asks its capabilities, not its name. It runs nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from gaudi_launch.plan.contract import worker_argv
from gaudi_launch.plan.launchplan import Command, LaunchPlan


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    plan.notes.append("pdsh-like test backend: nothing looked at")


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    hosts = ",".join(n.host for n in plan.nodes)
    assert plan.spec is not None
    return [Command(host="localhost", argv=["pdsh", "-w", hosts, *worker_argv(plan.spec)])]


def run(plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options):
    raise NotImplementedError("a test backend: plans only")
