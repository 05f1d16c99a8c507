"""Software that differs across hosts (remote/versions.py): the odd host fails with the table, or a warning
with --allow-version-mismatch; unknowns and hosts without OpenMPI are no difference."""

from __future__ import annotations

from gaudi_launch.remote import versions
from gaudi_launch.remote.preflight import CheckReport, HostFacts


def facts(host, **kw):
    base = dict(python_ok=True, python_version="3.11.7", torch="2.13.0+cpu", transformers="5.24.0")
    return HostFacts(host=host, ok=True, **{**base, **kw})


def report(*fs):
    return CheckReport(facts={f.host: f for f in fs})


def test_the_same_software_everywhere_passes_and_a_missing_mpirun_is_no_difference():
    r = report(facts("a", openmpi="mpirun (Open MPI) 4.1.4"), facts("b", python_version="3.11.2"), facts("c"))
    versions.judge(r, allow=False)
    assert r.ok and r.warnings == []


def test_the_odd_host_fails_with_the_table_and_allow_makes_it_a_warning():
    r = report(facts("a"), facts("b", torch="9.9.9"), facts("c"), facts("d", python_version="3.12.1"))
    versions.judge(r, allow=False)
    assert [f.host for f in r.failures()] == ["b", "d"]
    assert r.facts["b"].reason.startswith("software differs across hosts: torch 9.9.9 here, 2.13.0+cpu on the other")
    lines = r.facts["b"].reason.splitlines()[1:]
    assert [line.split() for line in lines] == [
        ["a", "b", "c", "d"],
        ["Python", "3.11", "3.11", "3.11", "3.12"],
        ["torch", "2.13.0+cpu", "9.9.9", "2.13.0+cpu", "2.13.0+cpu"],
    ]
    assert "--allow-version-mismatch" in r.facts["b"].fix
    r = report(facts("a"), facts("b", torch="9.9.9"))
    versions.judge(r, allow=True)
    assert r.ok and r.warnings[0].startswith("software differs across hosts (--allow-version-mismatch")
