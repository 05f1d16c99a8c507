"""Which Open MPI each host has, and whether they can run one job together.

mpirun here starts a daemon on every host (OpenMPI 4: ORTE's orted; 5: PRRTE's prted), and the two
runtimes do not talk to each other: every host must have this host's major version. 5 replaced ORTE
with PRRTE (https://open-mpi.org/software/ompi/major-changes.php, "v5.0.x series", item 2), so the
flags differ too (backends/mpirun.py's table).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Optional

_VERSION = re.compile(r"Open MPI\)?\s+(\d+)\.")


def major(version_line: Optional[str]) -> Optional[int]:
    """4 from "mpirun (Open MPI) 4.1.4"; None for no line or another MPI (MPICH, Intel MPI). Pure."""
    m = _VERSION.search(version_line or "")
    return int(m.group(1)) if m else None


def local_version(mpirun: str = "mpirun") -> Optional[str]:
    """This host's `mpirun --version`; None when mpirun is missing or does not answer. Asked once per mpirun,
    however it is called (functools.cache alone would run it again for ``local_version()`` after
    ``local_version("mpirun")``: another key)."""
    return _version_of(mpirun)


@functools.cache
def _version_of(mpirun: str) -> Optional[str]:
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


# The tag before each piece of a rank's output: OpenMPI 4 (ORTE) writes "[1,0]<stdout>:text";
# OpenMPI 5 (PMIx's iof) writes "[1,0]<stdout>: text" (one space, part of the tag), and its job
# part is a namespace's suffix, a number unless the namespace has no '@'.
_TAGS = {
    4: re.compile(r"\[(\d+),(\d+)\]<(?:stdout|stderr)>:"),
    5: re.compile(r"\[([^,\[\]]+),(\d+)\]<(?:stdout|stderr|stddiag)>: "),
}


# Where OpenMPI lives outside the system's directories: Habana's RHEL-family images (HabanaAI/Setup_and_Install
# dockerfiles/base: MPI_ROOT=/opt/habanalabs/openmpi) and AWS's DLAMIs. Their PATH comes from Docker's ENV or a
# login profile, which the ssh session that starts a remote daemon does not read.
OPENMPI_HOMES = ("/opt/habanalabs/openmpi", "/opt/amazon/openmpi")
_SYSTEM_BIN = ("/usr/bin", "/bin", "/usr/local/bin")


def mpirun_and_prefix(on_path: Optional[str], installed: Sequence[str]) -> tuple[str, Optional[str]]:
    """(the mpirun to run, its --prefix or None). ``on_path``: PATH's mpirun (resolved); ``installed``: the
    OPENMPI_HOMES that hold bin/mpirun. An OpenMPI outside the system directories gets --prefix, so each
    remote daemon (orted/prted) is run from that prefix with its libraries (mpirun(1): "--prefix <dir>: prefix
    directory that will be used to set the PATH and LD_LIBRARY_PATH on the remote node"); without one on PATH,
    the first home that has it. Pure."""
    if on_path is None:
        return (os.path.join(installed[0], "bin", "mpirun"), installed[0]) if installed else ("mpirun", None)
    directory = os.path.dirname(on_path)
    if directory in _SYSTEM_BIN or os.path.basename(directory) != "bin":
        return "mpirun", None
    return on_path, os.path.dirname(directory)


def local_mpirun() -> tuple[str, Optional[str]]:
    """This host's mpirun and its --prefix (mpirun_and_prefix)."""
    homes = [h for h in OPENMPI_HOMES if os.access(os.path.join(h, "bin", "mpirun"), os.X_OK)]
    return mpirun_and_prefix(shutil.which("mpirun"), homes)


class OmpiDemux:
    """Reassembles per-rank lines from mpirun's tagged output.

    OpenMPI 4 tags chunks, not lines: a rank's line can arrive in pieces, interleaved with other
    ranks' pieces on one physical line, e.g. ``[1,0]<stdout>:hi[1,1]<stdout>:other``. Every
    piece starts with a tag, and the physical newline ends the last piece's line. OpenMPI 5 tags
    whole lines, but a last line without a newline still runs into the next tag. A physical line
    without a leading tag is mpirun's own message.
    """

    def __init__(self, major: Optional[int] = 4):
        self.tag = _TAGS[5 if (major or 4) >= 5 else 4]
        self.partial: dict[int, str] = {}

    def __call__(self, line: Optional[str]) -> list[tuple[Optional[int], str]]:
        if line is None:
            out: list[tuple[Optional[int], str]] = [(r, t) for r, t in sorted(self.partial.items()) if t]
            self.partial.clear()
            return out
        if not self.tag.match(line):
            return [(None, line)]
        pieces = self.tag.split(line)  # ['', job, rank, data, job, rank, data, ...]
        last = -1  # (the tag matched at the start: the loop runs at least once)
        for i in range(1, len(pieces) - 2, 3):
            last = int(pieces[i + 1])
            self.partial[last] = self.partial.get(last, "") + pieces[i + 2]
        return [(last, self.partial.pop(last))]
