"""Which Open MPI each host has, and whether they can run one job together.

mpirun here starts a daemon on every host (OpenMPI 4: ORTE's orted; 5: PRRTE's prted), and the two
runtimes do not talk to each other: every host must have this host's major version. 5 replaced ORTE
with PRRTE (https://open-mpi.org/software/ompi/major-changes.php, "v5.0.x series", item 2), so the
flags differ too (backends/mpirun.py's table).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Optional

_VERSION = re.compile(r"Open MPI\)?\s+(\d+)\.")


def major(version_line: Optional[str]) -> Optional[int]:
    """4 from "mpirun (Open MPI) 4.1.4"; None for no line or another MPI (MPICH, Intel MPI). Pure."""
    m = _VERSION.search(version_line or "")
    return int(m.group(1)) if m else None


@functools.cache
def local_version(mpirun: str = "mpirun") -> Optional[str]:
    """This host's `mpirun --version`; None when mpirun is missing or does not answer."""
    if not shutil.which(mpirun):
        return None
    try:
        return subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def mismatches(by_host: Mapping[str, Optional[str]], launcher: Optional[str]) -> dict[str, tuple[str, str]]:
    """The hosts whose OpenMPI major version differs from the one that starts the job: host -> (reason,
    fix). ``by_host``: each host's `mpirun --version` line; ``launcher``: this host's (its mpirun starts
    every daemon), or when it has none, the first host's that has one. A host without OpenMPI is not
    judged here (mpirun may still find its daemon through --prefix): the pre-flight warns. Pure."""
    ref_line = launcher if major(launcher) is not None else next((v for v in by_host.values() if major(v)), None)
    ref = major(ref_line)
    if ref is None:
        return {}
    where = (
        "the launcher's host" if major(launcher) is not None else next(h for h, v in by_host.items() if major(v) == ref)
    )
    ref_text = _one_line(ref_line)
    out = {}
    for host, line in by_host.items():
        found = major(line)
        if found is not None and found != ref:
            out[host] = (
                f"OpenMPI {found} here ({_one_line(line)}) but OpenMPI {ref} on {where} ({ref_text}): "
                "mpirun's daemons of different major versions cannot run one job",
                f"install OpenMPI {ref} on {host} (or the same major version everywhere), "
                "or use --backend deepspeed with its pdsh launcher",
            )
    return out


def _one_line(text: Optional[str]) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def judge(report, launcher: Optional[str]) -> None:
    """Fail, in a pre-flight report (preflight.CheckReport), each host whose OpenMPI major version is not
    the launcher's (see mismatches); a host that failed already keeps its first reason."""
    for host, (reason, fix) in mismatches({h: f.openmpi for h, f in report.facts.items()}, launcher).items():
        facts = report.facts[host]
        if facts.ok:
            facts.ok, facts.reason, facts.fix = False, reason, fix
