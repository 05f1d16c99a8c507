"""The scale-out path per host (issue 24, item 1): the decision for each generation and fabric (pure), the
probe's facts from the hl-smi / fi_info stand-ins, and a dry run's plan on stood-in Gaudi 3 and DL1 hosts.

Habana, "Scale-out via Host NIC": P0 Gaudi NICs, P1 host NIC Gaudi Direct (EFA libfabric >= 1.16.1 or verbs
1.20.0, kernel >= 5.12; EFA also RDMAV_FORK_SAFE=1, FI_EFA_USE_DEVICE_RDMA=1), P2 host NIC through host
memory, P3 none; HCCL_OVER_OFI forces P2 (first-generation Gaudi's recipe).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import scaleout
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.plan.scaleout import HostFabric, decide
from gaudi_launch.remote import probe
from gaudi_launch.remote.preflight import SshOptions, check_hosts
from tests.standin import gaudi_tools

NEW = "6.8.0-45-generic"
G3 = "HL-325L"
G2 = "HL-225"
DL1 = "HL-205"


@pytest.mark.parametrize(
    "facts, efa, code, env",
    [
        # Gaudi's own scale-out ports up: P0, nothing to set
        (HostFabric(G3, kernel=NEW, external_ports=(8, 22, 23), ports_up=24), None, "P0", {}),
        # Gaudi 3 / Gaudi 2, ports not cabled, EFA, new libfabric and kernel: Gaudi Direct over EFA
        (
            HostFabric(G3, kernel=NEW, libfabric="1.22.0amzn4.0", rdma_devices=("efa_0",)),
            None,
            "P1",
            scaleout.EFA_GDR_ENV,
        ),
        (HostFabric(G2, kernel=NEW, libfabric="1.16.1", efa_provider=True), None, "P1", scaleout.EFA_GDR_ENV),
        # too old a libfabric or kernel for Gaudi Direct: host memory, HCCL's own choice (no HCCL_OVER_OFI)
        (HostFabric(G2, kernel=NEW, libfabric="1.16.0", rdma_devices=("efa_0",)), None, "P2", {}),
        (HostFabric(G3, kernel="5.11.0", libfabric="1.22.0", rdma_devices=("efa_0",)), None, "P2", {}),
        # verbs: libfabric 1.20 and fork safety
        (
            HostFabric(G3, kernel=NEW, libfabric="1.20.0", rdma_devices=("mlx5_0", "hbl_0")),
            None,
            "P1",
            {"RDMAV_FORK_SAFE": "1"},
        ),
        (HostFabric(G3, kernel=NEW, libfabric="1.19.1", rdma_devices=("mlx5_0",)), None, "P2", {}),
        # no RDMA NIC: tcp provider, or nothing at all
        (HostFabric(G2, kernel=NEW, libfabric="1.22.0"), None, "P2", {}),
        (HostFabric(G2, kernel=NEW), None, "P3", {}),
        # DL1: first-generation Gaudi over EFA keeps HCCL_OVER_OFI
        (
            HostFabric(DL1, kernel=NEW, libfabric="1.19.0amzn4.0", rdma_devices=("efa_0",)),
            None,
            "P2",
            {"HCCL_OVER_OFI": "1"},
        ),
        # --no-efa on DL1: no OFI recipe; --efa on a Gaudi 3 whose EFA devices were not seen: Gaudi Direct
        (HostFabric(DL1, kernel=NEW, libfabric="1.19.0", rdma_devices=("efa_0",)), False, "P2", {}),
        (HostFabric(G3, kernel=NEW, libfabric="1.22.0"), True, "P1", scaleout.EFA_GDR_ENV),
        # no hl-smi answer: EFA keeps the recipe this launcher always used, else nothing is set
        (HostFabric(kernel=NEW, rdma_devices=("efa_0",)), None, "P2", {"HCCL_OVER_OFI": "1"}),
        (HostFabric(kernel=NEW), None, "?", {}),
    ],
)
def test_path_for_each_generation_and_fabric(facts, efa, code, env):
    got = decide(facts, efa)
    assert (got.code, got.as_dict()["env"]) == (code, dict(env)), got.why
    assert got.why
    if code in ("P1", "P2", "P3") and facts.generation in (2, 3):  # why no HCCL_OVER_OFI: the generation
        assert got.why.startswith(f"Gaudi {facts.generation} ({facts.device_name}), its scale-out ports"), got.why


def test_some_ports_down_the_plan_agrees_with_the_preflight():
    """Some scale-out ports up, some down: the pre-flight fails the host because HCCL would take its Gaudi
    NICs (port_finding, fatal); the plan's path says the same (P0 and why), not a host NIC path with its
    "scale-out ports down", even where EFA and Gaudi Direct would be there."""
    down = ("0000:1b:00.0 port 22", "0000:1c:00.0 port 22")
    facts = HostFabric(
        G3,
        kernel=NEW,
        libfabric="1.22.0",
        rdma_devices=("efa_0",),
        external_ports=(8, 22),
        ports_up=22,
        ports_down=down,
    )
    got = decide(facts)
    assert (got.code, got.name, got.as_dict()["env"]) == ("P0", "Gaudi NICs", {})
    assert got.why == (
        "22 Gaudi scale-out port(s) up but 0000:1b:00.0 port 22, 0000:1c:00.0 port 22 down: HCCL still takes "
        "the Gaudi NICs and the down port(s) break its collectives (a pre-flight failure until they are up)"
    )
    assert scaleout.port_finding(facts)[2]  # fatal in the pre-flight, for the same reason
    # every port down: both say host NIC (a pre-flight warning, not a failure)
    all_down = HostFabric(G3, kernel=NEW, libfabric="1.22.0", rdma_devices=("efa_0",), ports_up=0, ports_down=down)
    assert decide(all_down).code == "P1" and not scaleout.port_finding(all_down)[2]
    assert "its scale-out ports down" in decide(all_down).why


def test_generation_and_versions():
    assert [scaleout.generation_of(n) for n in ("HL-205", "HL-225", "HL-288", "HL-325L", "HL-338", "", None)] == [
        1,
        2,
        2,
        3,
        3,
        None,
        None,
    ]
    assert scaleout.version_tuple("1.22.0amzn4.0") == (1, 22, 0)
    assert scaleout._at_least("1.16.1", scaleout.EFA_MIN) and not scaleout._at_least("1.16", scaleout.EFA_MIN)


def test_combine_warns_when_hosts_differ():
    env, ofi, libs, warnings = scaleout.combine(
        {"a": decide(HostFabric(G3, kernel=NEW, ports_up=3, external_ports=(8,))), "b": decide(HostFabric(G3))}
    )
    assert env == {} and not ofi and not libs
    assert "different scale-out paths (a: P0; b: P3)" in warnings[0] and "no scale-out path on b" in warnings[1]


def _probe(tmp_path, profile):
    env = {**os.environ, **gaudi_tools.settings(profile, os.environ["PATH"])}
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    return probe.parse(done.stdout)


@pytest.mark.parametrize(
    "profile, gen, code, up, down",
    [
        ("gaudi3-hostnic", 3, "P1", 0, 24),
        ("gaudi3-gaudinic", 3, "P0", 24, 0),
        ("gaudi2-oldfabric", 2, "P2", 0, 24),
        ("dl1", 1, "P2", None, 0),
    ],
)
def test_probe_reads_the_stand_in_tools(tmp_path, profile, gen, code, up, down):
    got = _probe(tmp_path, profile)
    assert got.complete and got.devices == 8  # the existing module_id query still answered
    facts = scaleout.parse_probe_block(got.scaleout)
    assert (facts.generation, facts.ports_up, len(facts.ports_down)) == (gen, up, down)
    assert facts.driver and facts.kernel == os.uname().release
    assert decide(facts).code == code


def test_ports_partly_down_fail_the_preflight(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "gaudi2-portdown")
    report = _preflight(["gaudi-a"], tmp_path)
    f = report.facts["gaudi-a"]
    assert not f.ok and "Gaudi scale-out NIC port(s) down: 0000:19:00.0 port 9" in f.reason
    assert "hl-fw-loader" in f.fix and "Disable_Enable_External_NICs" in f.fix


def _preflight(hosts, tmp_path):
    return check_hosts(
        hosts,
        python=sys.executable,
        script=None,
        cwd=str(tmp_path),
        master_host=hosts[0],
        master_addr="127.0.0.1",
        master_port=None,
        devices_needed={},
        ssh=SshOptions(),
        local=lambda h: True,
    )


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("HCCL_", "FI_", "RDMAV_")) or name == "LD_LIBRARY_PATH":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    (tmp_path / "train.py").write_text("")


def _dry_run(tmp_path, monkeypatch, profile, **options):
    gaudi_tools.apply(monkeypatch, profile)
    spec = JobSpec(program=["train.py"], hostfile="hostfile", backend="mpirun", master_addr="127.0.0.1", **options)
    return build_plan(
        spec,
        environ=dict(os.environ),
        preflight=lambda plan, spec: _preflight(["gaudi-a", "gaudi-b"], tmp_path),
        backends=get_backend,
    )


def test_dry_run_gaudi3_host_nic_takes_gaudi_direct(tmp_path, monkeypatch, clean_env):
    plan = _dry_run(tmp_path, monkeypatch, "gaudi3-hostnic")
    assert "HCCL_OVER_OFI" not in plan.env
    assert plan.env["RDMAV_FORK_SAFE"] == "1" and plan.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert plan.env["LD_LIBRARY_PATH"].startswith("/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib")
    data = plan.to_dict()
    assert {h: p["path"] for h, p in data["scaleout"].items()} == {"gaudi-a": "P1", "gaudi-b": "P1"}
    assert data["scaleout"]["gaudi-a"]["page"] == scaleout.SCALE_OUT_PAGE
    text = plan.render_text()
    assert "note: scale-out gaudi-a: P1 host NIC Gaudi Direct (EFA): " in text and ">= 1.16.1" in text
    assert "HCCL_OVER_OFI" not in text
    # every Gaudi scale-out port down: a warning with the fix, the job still runs over the host NIC
    assert any("HCCL falls back to a host NIC" in w for w in plan.preflight["warnings"])
    # --no-efa: no EFA variables at all
    plan = _dry_run(tmp_path, monkeypatch, "gaudi3-hostnic", efa=False)
    assert not {"HCCL_OVER_OFI", "FI_EFA_USE_DEVICE_RDMA", "LD_LIBRARY_PATH"} & set(plan.env)


def test_dry_run_dl1_keeps_the_efa_recipe(tmp_path, monkeypatch, clean_env):
    plan = _dry_run(tmp_path, monkeypatch, "dl1")
    assert plan.env["HCCL_OVER_OFI"] == "1"
    assert plan.env["LD_LIBRARY_PATH"] == "/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib"
    assert "FI_EFA_USE_DEVICE_RDMA" not in plan.env
    assert plan.to_dict()["scaleout"]["gaudi-b"]["env"] == {"HCCL_OVER_OFI": "1"}


def test_your_hccl_over_ofi_is_kept_and_named(tmp_path, monkeypatch, clean_env):
    monkeypatch.setenv("HCCL_OVER_OFI", "1")
    plan = _dry_run(tmp_path, monkeypatch, "gaudi3-hostnic")
    assert "HCCL_OVER_OFI" not in plan.env and "HCCL_OVER_OFI" in plan.exported  # yours, passed on as it is
    assert any(n.startswith("scale-out: HCCL_OVER_OFI=1 as you set it forces") for n in plan.notes), plan.notes
