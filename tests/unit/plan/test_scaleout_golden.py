"""One dry run per realistic cluster profile (issue 32), the scale-out part of its plan compared with a reviewed
golden file: Gaudi 2 on its own NICs, Gaudi 3 on verbs host NICs, Gaudi 3 with enabled but uncabled scale-out
ports, and DL1 on EFA. Two hosts, each this machine with the hl-smi / fi_info / sysfs stand-ins of the profile
(tests/standin/gaudi_tools.py), probed by the real pre-flight. docs/multinode.md's table is made from these.

Regenerate after an intended change with GOLDEN_UPDATE=1 and review the diff like code.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.remote.preflight import SshOptions, check_hosts
from tests.standin import gaudi_tools

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "golden")
PROFILES = ("gaudi2", "gaudi3-verbs", "gaudi3-uncabled", "dl1")
SCALEOUT_VARS = (
    "HCCL_OVER_OFI",
    "LD_LIBRARY_PATH",
    "MLX5_SCATTER_TO_CQE",
    "RDMAV_HUGEPAGES_SAFE",
    "RDMAV_FORK_SAFE",
    "FI_EFA_USE_DEVICE_RDMA",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("HCCL_", "FI_", "RDMAV_", "MLX5_", "HABANA_", "PT_HPU")) or name == "LD_LIBRARY_PATH":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    (tmp_path / "train.py").write_text("")


def scaleout_part(plan, tmp_path) -> dict:
    """What the plan says of the scale-out path: each host's, the variables, the pre-flight's verdict on each
    host, the notes about it; this machine's paths as HOST."""
    data = plan.to_dict()
    part = {
        "scaleout": data["scaleout"],
        "env": {k: v for k, v in data["env"].items() if k in SCALEOUT_VARS},
        "preflight": {
            "ok": data["preflight"]["ok"],
            "hosts": {h["host"]: {"reason": h["reason"], "fix": h["fix"]} for h in data["preflight"]["hosts"]},
        },
        "notes": [n for n in data["notes"] if n.startswith(("scale-out", "EFA"))],
    }
    return json.loads(json.dumps(part).replace(str(tmp_path), "HOST"))


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_dry_run_matches_golden(profile, tmp_path, monkeypatch, clean_env):
    gaudi_tools.apply(monkeypatch, profile, root=tmp_path / "host")
    spec = JobSpec(program=["train.py"], hostfile="hostfile", backend="mpirun", master_addr="127.0.0.1")
    plan = build_plan(
        spec,
        environ=dict(os.environ),
        preflight=lambda plan, spec: check_hosts(
            ["gaudi-a", "gaudi-b"],
            python=sys.executable,
            script=None,
            cwd=str(tmp_path),
            master_host="gaudi-a",
            master_addr="127.0.0.1",
            master_port=None,
            devices_needed={},
            ssh=SshOptions(),
            local=lambda h: True,
        ),
        keep_failed_preflight=True,
        backends=get_backend,
    )
    got = scaleout_part(plan, tmp_path)
    path = os.path.join(GOLDEN, f"scaleout-{profile}.json")
    if os.environ.get("GOLDEN_UPDATE") == "1":
        with open(path, "w") as f:
            json.dump(got, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(path) as f:
        assert got == json.load(f)
