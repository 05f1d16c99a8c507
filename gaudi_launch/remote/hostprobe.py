"""This machine's facts for the plan, read as every host's are: the pre-flight's probe (probe.sh) run here as a
local process, in its one-host form (no Python started, no scale-out links: nothing between hosts), its output
read by ``probe.read_facts`` into the same HostFacts the SSH pre-flight and Slurm's srun probe give.

For the hosts of a plan that are this machine when no pre-flight read them (the local backend always; mpirun or
DeepSpeed with --no-ssh-check). About 15 ms on a machine without Gaudi (measured under load); on a Gaudi host
two hl-smi queries, where reading the cards cost one before.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import Optional

from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.remote import probe

TIMEOUT = 30.0  # seconds; each tool in the probe has its own 20 s limit


def probe_here(host: str, python: str, script: Optional[str], cwd: str) -> Optional[HostFacts]:
    """This machine's facts under the name ``host``; None when the probe could not run or did not finish."""
    command = probe.command(python, script, cwd, "127.0.0.1", 0, None, one_host=True)
    try:
        done = subprocess.run(["sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    found = probe.parse(done.stdout)
    if not found.complete:
        return None
    facts = probe.facts_of(host, found, script=script, cwd=cwd)
    facts.one_host = True  # its scale-out links were not read: no path is decided from it
    return facts


def facts_here(plan: LaunchPlan) -> dict[str, HostFacts]:
    """The facts of the plan's hosts that are this machine (probed once), unless a pre-flight read them."""
    hosts = [n.host for n in plan.nodes if is_local_host(n.host)]
    if not hosts or plan.preflight is not None:
        return {}
    spec = plan.job
    script = spec.program[0] if spec.program and not spec.module and not spec.no_python else None
    found = probe_here(hosts[0], spec.python, script, os.getcwd())
    if found is None:
        return {}
    return {h: found if h == hosts[0] else _renamed(found, h) for h in hosts}


def _renamed(facts: HostFacts, host: str) -> HostFacts:
    return dataclasses.replace(facts, host=host)
