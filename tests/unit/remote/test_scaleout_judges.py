"""The pre-flight's judges of issue 32: partial nodes in a scale-out job (remote/partialnodes.py, item 6) and
Gaudi driver / firmware drift (remote/versions.py, item 7), on facts the hl-smi stand-in gives a real probe."""

from __future__ import annotations

import os

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.plan.scaleout import HostFabric
from gaudi_launch.remote import partialnodes, samemachine, versions
from gaudi_launch.remote.hostchecks import run_preflight
from gaudi_launch.remote.preflight import CheckReport, HostFacts
from tests.standin import gaudi_tools

G3_DRIVER = "1.22.1-97ec1a4"
FW = "Preboot version hl-gaudi3-1.22.1-fw-61.4.2.1-sec-9"


@pytest.fixture
def two_hosts(tmp_path, monkeypatch):
    """A hostfile of two 8-card Gaudi 3 hosts that are both this machine (the stand-in's server)."""
    for name in list(os.environ):
        if name.startswith(("HCCL_", "HABANA_")):
            monkeypatch.delenv(name)
    gaudi_tools.apply(monkeypatch, "gaudi3-gaudinic", root=tmp_path / "host")
    monkeypatch.setattr(samemachine, "judge", lambda report: None)  # two names of this machine stand for two servers
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    (tmp_path / "train.py").write_text("")


def _plan(**options):
    spec = JobSpec(program=["train.py"], hostfile="hostfile", backend="mpirun", master_addr="127.0.0.1", **options)
    return build_plan(
        spec,
        environ=dict(os.environ),
        preflight=lambda plan, spec: run_preflight(plan, spec, local=lambda h: True, share=False),
        keep_failed_preflight=True,
        backends=get_backend,
    )


def test_partial_nodes_in_a_scale_out_job_fail_unless_allowed(two_hosts):
    plan = _plan(include="gaudi-a:4,5@gaudi-b:4,5")
    failed = {f["host"]: f for f in plan.preflight["hosts"] if not f["ok"]}
    assert set(failed) == {"gaudi-a", "gaudi-b"}, plan.preflight
    reason = failed["gaudi-a"]["reason"]
    assert reason.startswith("a job of several hosts on part of this host (module(s) ")
    assert "of its 8 cards" in reason and partialnodes.ASSIGNMENT_PAGE in reason
    assert "--allow-partial-nodes" in failed["gaudi-a"]["fix"]
    plan = _plan(include="gaudi-a:4,5@gaudi-b:4,5", allow_partial_nodes=True)
    assert plan.preflight["ok"]
    assert any(
        w.startswith("partial nodes in a job of several hosts (--allow-partial-nodes")
        for w in plan.preflight["warnings"]
    )


def test_whole_nodes_and_one_host_jobs_are_no_partial_nodes(two_hosts):
    assert _plan().preflight["ok"]
    facts = {"a": HostFacts(host="a", ok=True)}
    assert partialnodes.partial_nodes({"a": [0, 1]}, facts) == {}  # one host: scale-up, 2-card sets are Habana's


def facts(host, driver=G3_DRIVER, firmware=(FW,) * 8, bridge="1.22.0.740"):
    return HostFacts(
        host=host,
        ok=True,
        python_ok=True,
        python_version="3.11.7",
        torch="2.9.0",
        habana_bridge=bridge,
        fabric=HostFabric("HL-325L", driver=driver, firmware=firmware),
    )


def test_driver_and_firmware_drift_fail_like_a_torch_mismatch():
    r = CheckReport(facts={h.host: h for h in (facts("a"), facts("b", driver="1.22.0-abc"), facts("c"))})
    versions.judge(r, allow=False)
    assert [f.host for f in r.failures()] == ["b"]
    assert r.facts["b"].reason.startswith("software differs across hosts: Gaudi driver 1.22.0-abc here, 1.22.1-97ec1a4")
    other = FW.replace("61.4.2.1", "61.3.0.0")
    r = CheckReport(facts={"a": facts("a"), "b": facts("b", firmware=(FW,) * 7 + (other,))})
    versions.judge(r, allow=False)
    assert [f.host for f in r.failures()] == ["b"] and "Gaudi firmware" in r.facts["b"].reason
    r = CheckReport(facts={"a": facts("a"), "b": facts("b", driver="1.22.0-abc")})
    versions.judge(r, allow=True)
    assert r.ok and "Gaudi driver" in r.warnings[0]


def test_a_driver_of_another_release_than_the_bridge_fails():
    r = CheckReport(facts={"a": facts("a", driver="1.21.3-2f7c1b9"), "b": facts("b", driver="1.21.3-2f7c1b9")})
    versions.judge(r, allow=False)
    assert [f.host for f in r.failures()] == ["a", "b"]
    assert r.facts["a"].reason.startswith(
        "Gaudi driver 1.21.3-2f7c1b9 with Gaudi bridge 1.22.0.740: releases 1.21 and 1.22"
    )
    assert "--allow-version-mismatch" in r.facts["a"].fix
    r = CheckReport(facts={"a": facts("a", driver="1.21.3-2f7c1b9")})
    versions.judge(r, allow=True)
    assert r.ok and "releases 1.21 and 1.22" in r.warnings[0]


def test_the_probe_reads_every_cards_firmware(tmp_path, monkeypatch):
    from gaudi_launch.plan import scaleout
    from tests.unit.plan.test_scaleout import _probe

    got = scaleout.parse_probe_block(_probe(tmp_path, "gaudi3-gaudinic", GAUDI_STANDIN_FIRMWARE="1.22.1-fw-9").scaleout)
    assert got.firmware == ("Preboot version hl-gaudi3-1.22.1-fw-9-sec-9",) * 8
