"""The scale-out path per host (issues 24 and 32): the decision HCCL for Gaudi 2 and 3 makes, read from its source
(HabanaAI/HCL 54fed3a), first-generation Gaudi's (DL1) recipe, the probe's facts from the hl-smi / fi_info /
sysfs stand-ins, and what the pre-flight and a dry run make of them.

HCL: IHclDevice::setScaleoutMode (hcl_idevice.cpp) takes the Gaudi NICs for any *enabled* scale-out port,
cabled or not; else OFI when OfiPlugin dlopens libhccl_ofi_wrapper.so (ofi_plugin.cpp), with Gaudi Direct when
libfabric >= 1.20 and ib_umem_dmabuf_get is in /proc/kallsyms (hl_ofi.cpp ofi_t::init, checkDMABUFSupport);
the tcp and verbs providers only (get_core_provider); else nothing.
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
WRAPPER = ("dir /usr/lib/habanalabs",)
VERBS = ("mlx5_0", "hbl_0")
GDR_IF = ["libfabric was built --with-synapseai", "PCIe ACS is off"]


def g3_block(states: str, *, ports: str = "8 22 23", extra: str = "") -> str:
    """A Gaudi 3 host's probe block: two cards, every port of ``ports`` external, each link in ``states`` (one
    word per read, UP or DOWN, for every port listed), a verbs NIC and libfabric 1.22."""
    lines = ["@@uname -r", NEW, "@@ls /sys/class/infiniband", "mlx5_0", "hbl_0", "@@fi_info --version"]
    lines += ["libfabric: 1.22.0", "@@hl-smi -Q name,driver_version,bus_id -f csv,noheader"]
    lines += ["HL-325L, 1.22.1-97ec1a4, 0000:1b:00.0", "HL-325L, 1.22.1-97ec1a4, 0000:1c:00.0"]
    lines += ["@@hl-smi -n ports -i 0000:1b:00.0", "port 3: internal"] + [f"port {p}: external" for p in ports.split()]
    for state in states.split():
        for bus in ("0000:1b:00.0", "0000:1c:00.0"):
            lines.append(f"@@hl-smi -n link -i {bus}")
            lines += [f"port {p:>2}:        {state}" for p in ["3", *ports.split()]]
    return "\n".join(lines) + "\n" + extra


# ---------------------------------------------------------------- item 1: enabled ports, not link state


def test_enabled_scale_out_ports_that_are_down_still_mean_p0_and_fail_the_preflight():
    """HCL counts the ports the driver enabled; every Gaudi scale-out port DOWN (not cabled, the host meant to use
    its host NICs) is still P0, and a hang, so the pre-flight fails with Habana's remedy."""
    f = scaleout.parse_probe_block(g3_block("DOWN", ports="8 22 23").replace("port  3:        DOWN", "port  3: UP"))
    assert f.scaleout_ports == (8, 22, 23) and f.ports_up == 0 and len(f.ports_down) == 6
    got = decide(f)
    assert (got.code, got.name, got.as_dict()["env"]) == ("P0", "Gaudi NICs", {})
    assert "HCL setScaleoutMode" in got.why and "hangs at the first collective" in got.why
    reason, fix, fatal = scaleout.port_finding(f)
    assert fatal and reason.startswith("Gaudi scale-out NIC port(s) enabled but down: 0000:1b:00.0 port 8")
    assert "hl-fw-loader" in fix and "cable them" in fix and scaleout.NIC_PAGE in fix


def test_disabled_scale_out_ports_leave_the_host_nic_path():
    """Ports switched off with hl-fw-loader are not in the driver's external mask: HCL goes to OFI."""
    f = scaleout.parse_probe_block(g3_block("UP", ports="") + "@@find libhccl_ofi_wrapper.so\ndir /opt/w\n")
    assert f.scaleout_ports == () and f.ports_up == 0
    got = decide(f)
    assert got.code == "P1" and got.why.startswith("Gaudi 3 (HL-325L), no Gaudi scale-out port enabled; verbs NIC")
    assert scaleout.port_finding(f) is None and got.lib_dirs == ("/opt/w",)


def test_gaudi2_counts_only_hcl_default_scale_out_ports():
    """HCL hcl_consts.h DEFAULT_SCALEOUT_PORTS_MASK 0xc00100: ports 8, 22, 23 on Gaudi 2; Gaudi 3 takes every
    external port (0xFFFFFF)."""
    assert HostFabric(G2, external_ports=(1, 8, 9, 22, 23)).scaleout_ports == (8, 22, 23)
    assert HostFabric(G3, external_ports=(1, 8, 9)).scaleout_ports == (1, 8, 9)


# ---------------------------------------------------------------- items 2-4: the host-NIC paths


@pytest.mark.parametrize(
    "facts, code, env, unless",
    [
        # verbs, libfabric >= 1.20, dmabuf in kallsyms: Gaudi Direct if what no tool shows holds, else P2
        (
            HostFabric(G3, kernel=NEW, libfabric="1.20.0", rdma_devices=VERBS, dmabuf=True, ofi_wrapper=WRAPPER),
            "P1",
            scaleout.VERBS_GDR_ENV,
            GDR_IF,
        ),
        # no ib_umem_dmabuf_get (HCL checkDMABUFSupport), or libfabric < 1.20: host memory
        (HostFabric(G3, kernel=NEW, libfabric="1.22.0", rdma_devices=VERBS, dmabuf=False), "P2", {}, None),
        (HostFabric(G2, kernel=NEW, libfabric="1.19.1", rdma_devices=VERBS, dmabuf=True), "P2", {}, None),
        # EFA is no provider HCL takes: tcp, host memory, no Gaudi Direct variables
        (HostFabric(G3, kernel=NEW, libfabric="1.22.0amzn4.0", rdma_devices=("efa_0",)), "P2", {}, None),
        (HostFabric(G2, kernel=NEW, libfabric="1.22.0", efa_provider=True), "P2", {}, None),
        # no libfabric, or no OFI wrapper: no scale-out at all
        (HostFabric(G2, kernel=NEW), "P3", {}, None),
        (
            HostFabric(G3, kernel=NEW, libfabric="1.22.0", rdma_devices=VERBS, dmabuf=True, ofi_wrapper=()),
            "P3",
            {},
            None,
        ),
        # DL1: first-generation Gaudi over EFA keeps HCCL_OVER_OFI
        (
            HostFabric(DL1, kernel=NEW, libfabric="1.19.0amzn4.0", rdma_devices=("efa_0",)),
            "P2",
            {"HCCL_OVER_OFI": "1"},
            None,
        ),
        # no hl-smi answer: EFA keeps the recipe this launcher always used, else nothing is set
        (HostFabric(kernel=NEW, rdma_devices=("efa_0",)), "P2", {"HCCL_OVER_OFI": "1"}, None),
        (HostFabric(kernel=NEW), "?", {}, None),
    ],
)
def test_path_for_each_generation_and_fabric(facts, code, env, unless):
    got = decide(facts)
    assert (got.code, got.as_dict()["env"], got.as_dict().get("if")) == (code, dict(env), unless), got.why
    if facts.generation in (2, 3):  # never HCCL_OVER_OFI, never EFA's Gaudi Direct variables on Gaudi 2/3
        assert not {"HCCL_OVER_OFI", "FI_EFA_USE_DEVICE_RDMA"} & set(got.as_dict()["env"]) and not got.ofi_recipe
        assert got.why.startswith(f"Gaudi {facts.generation} ({facts.device_name})"), got.why


def test_efa_on_gaudi3_says_why_it_is_not_taken():
    got = decide(HostFabric(G3, kernel=NEW, libfabric="1.22.0amzn4.0", rdma_devices=("efa_0",)), efa=True)
    assert got.name == "host NIC through host memory (tcp)" and "get_core_provider: tcp and verbs only" in got.why


def test_verbs_gaudi_direct_is_conditional_in_what_the_plan_says():
    got = decide(HostFabric(G3, kernel=NEW, libfabric="1.22.0", rdma_devices=VERBS, dmabuf=True))
    assert got.shown == (
        "P1 host NIC Gaudi Direct (verbs) if libfabric was built --with-synapseai and PCIe ACS is off, else P2"
    )
    assert got.env["MLX5_SCATTER_TO_CQE"] == "0" and got.as_dict()["else"] == "P2"
    assert "ib_umem_dmabuf_get in /proc/kallsyms" in got.why


def test_no_ofi_wrapper_is_a_preflight_failure_with_the_fix():
    f = HostFabric(G3, kernel=NEW, libfabric="1.22.0", rdma_devices=VERBS, dmabuf=True, ofi_wrapper=(), ports_up=0)
    reason, fix = scaleout.wrapper_finding(f, decide(f))
    assert reason.startswith("libhccl_ofi_wrapper.so not found") and "ofi_plugin.cpp" in reason
    assert "hccl_ofi_wrapper" in fix and "/usr/lib/habanalabs" in fix and "ldconfig" in fix
    # found through ldconfig's cache: nothing to add to LD_LIBRARY_PATH
    found = HostFabric(G3, libfabric="1.22.0", ofi_wrapper=("ldconfig /usr/lib/habanalabs/libhccl_ofi_wrapper.so",))
    assert scaleout.wrapper_finding(found, decide(found)) is None and decide(found).lib_dirs == ()


# ---------------------------------------------------------------- item 8: every port, several reads


def test_internal_ports_down_and_flapping_ports_are_findings():
    f = scaleout.parse_probe_block(g3_block("UP UP UP").replace("port  3:        UP", "port  3:        DOWN", 1))
    assert f.internal_down == ("0000:1b:00.0 port 3",) and f.ports_down == () and decide(f).code == "P0"
    assert f.flapping == ("0000:1b:00.0 port 3",)  # UP in the later reads
    reasons = [r for r, _ in scaleout.link_findings(f)]
    assert reasons == ["Gaudi scale-up (internal) port(s) down: 0000:1b:00.0 port 3"]
    flap = scaleout.parse_probe_block(g3_block("UP DOWN UP"))
    assert "0000:1c:00.0 port 22" in flap.ports_down and "0000:1c:00.0 port 22" in flap.flapping


# ---------------------------------------------------------------- helpers kept from issue 24


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


# ---------------------------------------------------------------- the stand-ins, the pre-flight, a dry run


def _probe(tmp_path, profile, **overrides):
    values = gaudi_tools.settings(profile, os.environ["PATH"], **overrides)
    values.update(gaudi_tools.host_tree(tmp_path, values))
    env = {**os.environ, **{k: v for k, v in values.items() if k not in gaudi_tools.TREE}}
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    return probe.parse(done.stdout)


@pytest.mark.parametrize(
    "profile, gen, code, up, down",
    [
        ("gaudi3-verbs", 3, "P1", 0, 0),
        ("gaudi3-uncabled", 3, "P0", 0, 24),
        ("gaudi3-gaudinic", 3, "P0", 24, 0),
        ("gaudi2-oldfabric", 2, "P2", 0, 0),
        ("dl1", 1, "P2", 0, 0),
    ],
)
def test_probe_reads_the_stand_in_tools(tmp_path, profile, gen, code, up, down):
    got = _probe(tmp_path, profile)
    assert got.complete and got.devices == 8  # the existing module_id query still answered
    facts = scaleout.parse_probe_block(got.scaleout)
    assert (facts.generation, facts.ports_up, len(facts.ports_down)) == (gen, up, down)
    assert facts.driver and facts.kernel == os.uname().release
    assert decide(facts).code == code
    if profile.startswith("gaudi3-") and profile != "gaudi3-gaudinic":  # the stand-in sysfs tree, not /sys
        assert facts.rdma_devices == ("hbl_0", "mlx5_0", "mlx5_1") and facts.dmabuf is True
        assert facts.ofi_wrapper == (f"dir {tmp_path / 'ofi'}",)


def test_gaudi2_stand_in_scale_out_ports_are_hcl_default_mask(tmp_path):
    facts = scaleout.parse_probe_block(_probe(tmp_path, "gaudi2").scaleout)
    assert facts.external_ports == (8, 22, 23) == facts.scaleout_ports


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


def test_ports_partly_down_fail_the_preflight(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "gaudi2-portdown")
    report = _preflight(["gaudi-a"], tmp_path)
    f = report.facts["gaudi-a"]
    assert not f.ok and "Gaudi scale-out NIC port(s) enabled but down: 0000:19:00.0 port 22" in f.reason
    assert "hl-fw-loader" in f.fix and "Disable_Enable_External_NICs" in f.fix


def test_uncabled_enabled_ports_fail_the_preflight(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "gaudi3-uncabled", root=tmp_path / "host")
    f = _preflight(["gaudi-a"], tmp_path).facts["gaudi-a"]
    assert not f.ok and "Gaudi scale-out NIC port(s) enabled but down: 0000:1b:00.0 port 8" in f.reason
    assert "disable every Gaudi scale-out port with hl-fw-loader" in f.fix


def test_a_missing_ofi_wrapper_fails_the_preflight(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "gaudi3-verbs", root=tmp_path / "host", GAUDI_STANDIN_OFI_WRAPPER="")
    monkeypatch.delenv("HCCL_OFI_WRAPPER", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    f = _preflight(["gaudi-a"], tmp_path).facts["gaudi-a"]
    if os.path.exists("/usr/lib/habanalabs/libhccl_ofi_wrapper.so"):  # a machine with the real wrapper
        return
    assert not f.ok and "libhccl_ofi_wrapper.so not found" in f.reason and "hccl_demo README" in f.fix


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("HCCL_", "FI_", "RDMAV_", "MLX5_")) or name == "LD_LIBRARY_PATH":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    (tmp_path / "train.py").write_text("")


def _dry_run(tmp_path, monkeypatch, profile, **options):
    gaudi_tools.apply(monkeypatch, profile, root=tmp_path / "host")
    spec = JobSpec(program=["train.py"], hostfile="hostfile", backend="mpirun", master_addr="127.0.0.1", **options)
    return build_plan(
        spec,
        environ=dict(os.environ),
        preflight=lambda plan, spec: _preflight(["gaudi-a", "gaudi-b"], tmp_path),
        backends=get_backend,
    )


def test_dry_run_gaudi3_verbs_takes_gaudi_direct_if_it_can(tmp_path, monkeypatch, clean_env):
    plan = _dry_run(tmp_path, monkeypatch, "gaudi3-verbs")
    assert "HCCL_OVER_OFI" not in plan.env and "FI_EFA_USE_DEVICE_RDMA" not in plan.env
    assert plan.env["MLX5_SCATTER_TO_CQE"] == "0" and plan.env["RDMAV_HUGEPAGES_SAFE"] == "1"
    assert plan.env["LD_LIBRARY_PATH"] == str(tmp_path / "host" / "ofi")  # where the probe found the wrapper
    data = plan.to_dict()
    assert {h: p["path"] for h, p in data["scaleout"].items()} == {"gaudi-a": "P1", "gaudi-b": "P1"}
    assert data["scaleout"]["gaudi-a"]["if"] == GDR_IF and data["preflight"]["ok"]
    text = plan.render_text()
    assert (
        "note: scale-out gaudi-a: P1 host NIC Gaudi Direct (verbs) if libfabric was built --with-synapseai and "
        "PCIe ACS is off, else P2: Gaudi 3 (HL-325L), no Gaudi scale-out port enabled; verbs NIC mlx5_0, mlx5_1"
    ) in text
    assert "HCCL_OVER_OFI" not in text
    # --efa changes nothing on Gaudi 3
    assert "HCCL_OVER_OFI" not in _dry_run(tmp_path, monkeypatch, "gaudi3-verbs", efa=True).env


def test_dry_run_dl1_keeps_the_efa_recipe(tmp_path, monkeypatch, clean_env):
    plan = _dry_run(tmp_path, monkeypatch, "dl1")
    assert plan.env["HCCL_OVER_OFI"] == "1"
    assert plan.env["LD_LIBRARY_PATH"] == "/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib"
    assert "FI_EFA_USE_DEVICE_RDMA" not in plan.env
    assert plan.to_dict()["scaleout"]["gaudi-b"]["env"] == {"HCCL_OVER_OFI": "1"}


def test_your_hccl_over_ofi_is_kept_and_named(tmp_path, monkeypatch, clean_env):
    monkeypatch.setenv("HCCL_OVER_OFI", "1")
    plan = _dry_run(tmp_path, monkeypatch, "gaudi3-verbs")
    assert "HCCL_OVER_OFI" not in plan.env and "HCCL_OVER_OFI" in plan.exported  # yours, passed on as it is
    assert any(n.startswith("scale-out: HCCL_OVER_OFI=1 as you set it forces") for n in plan.notes), plan.notes


# ---------------------------------------------------------------- item 5: no pre-flight


@pytest.mark.parametrize(
    "flag, efa_here, gen, recipe",
    [
        (True, False, 3, False),  # --efa on Gaudi 3: never HCCL_OVER_OFI
        (None, True, 2, False),  # EFA devices on a Gaudi 2 host: HCCL chooses
        (None, True, None, False),  # EFA, generation unknown: left to HCCL, the note says --efa for DL1
        (None, True, 1, True),  # DL1
        (True, False, None, True),  # --efa where no hl-smi answers (a login node): DL1's recipe as asked
        (False, True, 1, False),
    ],
)
def test_without_a_preflight_hccl_over_ofi_is_for_dl1_only(flag, efa_here, gen, recipe):
    from gaudi_launch.plan import fabric

    got, note = fabric.ofi_recipe_without_facts(flag, efa_here, gen)
    assert got is recipe and note
    if gen in (2, 3):
        assert "left to HCCL's own choice" in note


def test_no_ssh_check_with_efa_on_a_gaudi3_host_sets_no_hccl_over_ofi(tmp_path, monkeypatch, clean_env):
    gaudi_tools.apply(monkeypatch, "gaudi3-verbs", root=tmp_path / "host")
    spec = JobSpec(
        program=["train.py"], hostfile="hostfile", backend="mpirun", master_addr="127.0.0.1", efa=True, ssh_check=False
    )
    plan = build_plan(spec, environ=dict(os.environ), backends=get_backend)
    assert "HCCL_OVER_OFI" not in plan.env
    assert any("--efa ignored" in n for n in plan.notes), plan.notes


# ---------------------------------------------------------------- item 8: gaudinet.json


GOOD_NET = '{"NIC_NET_CONFIG": [{"NIC_MAC": "b0:fd:0b:00:00:01", "NIC_IP": "10.1.0.2", "SUBNET_MASK": "255.255.255.252", "GATEWAY_MAC": "00:00:5e:00:01:01"}]}'


@pytest.mark.parametrize(
    "text, problem",
    [
        (GOOD_NET, None),
        ("{not json", "not valid JSON"),
        ('{"NICS": []}', "no NIC_NET_CONFIG list"),
        (GOOD_NET.replace('"GATEWAY_MAC": "00:00:5e:00:01:01"', '"GW": 1'), "entry 0 has no GATEWAY_MAC"),
        (GOOD_NET.replace("10.1.0.2", "0.0.0.0"), "NIC_IP '0.0.0.0' is not an IPv4 address"),
    ],
)
def test_gaudinet_json_is_checked_as_hcl_reads_it(text, problem):
    got = scaleout.gaudinet_problem(HostFabric(G3, gaudinet=("/etc/habanalabs/gaudinet.json", text)))
    assert (got is None) if problem is None else (problem in got[0] and "Configure E2E Test in L2/L3" in got[1])


def test_a_bad_gaudinet_json_fails_the_preflight(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "gaudi3-gaudinic", root=tmp_path / "host")
    net = tmp_path / "gaudinet.json"
    net.write_text('{"NIC_NET_CONFIG": [{"NIC_MAC": "b0:fd:0b:00:00:01"}]}')
    monkeypatch.setenv("HCL_GAUDINET_CONFIG_FILE", str(net))  # HCL's own variable (hcl_global_conf.cpp)
    f = _preflight(["gaudi-a"], tmp_path).facts["gaudi-a"]
    assert not f.ok and f"{net}: NIC_NET_CONFIG entry 0 has no NIC_IP, SUBNET_MASK, GATEWAY_MAC" in f.reason
    net.write_text(GOOD_NET)
    assert _preflight(["gaudi-a"], tmp_path).facts["gaudi-a"].ok


def test_internal_ports_of_a_pcie_card_are_not_judged():
    down = ("0000:1b:00.0 port 3",)
    assert scaleout.link_findings(HostFabric("HL-338", internal_down=down)) == []
    assert scaleout.link_findings(HostFabric("HL-325L", internal_down=down))
