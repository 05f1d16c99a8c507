"""`gaudi-launch env` shows the Gaudi generation, driver, NIC port state, libfabric and the scale-out path
(issue 24, item 8), read through the hl-smi / fi_info stand-ins (tests/standin/bin, tests/standin/fabric)."""

from __future__ import annotations

from gaudi_launch.reports import environment
from tests.standin import gaudi_tools


def test_env_report_shows_the_scale_out_facts(tmp_path, monkeypatch):
    gaudi_tools.apply(monkeypatch, "dl1")
    so = environment._scaleout()
    assert so["generation"] == "Gaudi (first generation)" and so["device"] == "HL-205"
    assert so["driver"] == "1.21.3-2f7c1b9" and so["libfabric"] == "1.19.0amzn4.0"
    # hl-smi --fw-versions, its first card's line first
    assert so["firmware"].startswith("[0000:10:1d.0] Firmware [SPI] Version : Preboot version hl-gaudi-1.21.3-fw-")
    assert so["firmware"].count("Firmware [SPI] Version") == 8  # every card's, not the first 4 (issue 32)
    assert so["path"]["path"] == "P2" and so["path"]["env"] == {"HCCL_OVER_OFI": "1"}
    text = "\n".join(environment._scaleout_lines({"scaleout": so, "reportncheck": None}))
    assert "Gaudi                    Gaudi (first generation) (HL-205)" in text
    assert "scale-out path           P2 host NIC over OFI, forced (HCCL_OVER_OFI=1): first-generation" in text
    assert "ReportNCheck             not installed" in text
    rows = environment.flatten(
        {
            **{k: "" for k in ("os", "python")},
            "cpus": 2,
            "devices": {"count": 8, "kind": "hpu"},
            "efa": True,
            "nics": [],
            "packages": {},
            "tools": {},
            "env": {},
            "scaleout": so,
            "reportncheck": None,
        }
    )
    assert rows["libfabric"] == "1.19.0amzn4.0" and rows["Gaudi"].startswith("Gaudi (first generation)")


def test_env_report_without_gaudi_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    so = environment._scaleout()
    if so["device"] is not None:  # a machine with the real hl-smi
        return
    assert so["path"]["path"] in ("?", "P2") and so["gaudi_scaleout_ports"] == "not read"


def test_env_report_shows_a_conditional_path_and_the_ofi_wrapper(tmp_path, monkeypatch):
    """Issue 32: the verbs host's path is "P1 ... if ..., else P2", and where the OFI wrapper resolves from."""
    gaudi_tools.apply(monkeypatch, "gaudi3-verbs", root=tmp_path)
    so = environment._scaleout()
    assert so["ofi_wrapper"] == [f"dir {tmp_path / 'ofi'}"]
    text = "\n".join(environment._scaleout_lines({"scaleout": so, "reportncheck": None}))
    assert f"OFI wrapper              dir {tmp_path / 'ofi'}" in text
    assert (
        "scale-out path           P1 host NIC Gaudi Direct (verbs) if libfabric was built --with-synapseai and "
        "PCIe ACS is off, else P2: Gaudi 3 (HL-325L)"
    ) in text
