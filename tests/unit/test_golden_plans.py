"""`--dry-run --json` per backend and scenario, compared with reviewed golden files.

Regenerate after an intended change with GOLDEN_UPDATE=1 and review the diff like code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile

import pytest

from gaudi_launch.cli import main
from gaudi_launch.inputs.envfile import is_secret

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden")
HOSTS = "gaudi-a slots=4\ngaudi-b slots=4\n"

SCENARIOS = {
    "mpirun-plain": ["--backend", "mpirun", "--no-efa"],
    "mpirun-efa": ["--backend", "mpirun", "--efa", "--hccl-ofi-wrapper", "/opt/hccl_ofi_wrapper"],
    "mpirun-exclude": ["--backend", "mpirun", "--no-efa", "--exclude", "gaudi-a:3@gaudi-b:3"],
    "deepspeed-plain": ["--backend", "deepspeed", "--no-efa"],
    "deepspeed-efa-include": [
        "--backend",
        "deepspeed",
        "--efa",
        "--include",
        "gaudi-a:0,1@gaudi-b:2,3",
        "--ssh-port",
        "3022",
    ],
}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith(("HCCL_", "PT_HPU", "HABANA_", "GC_", "HLS_", "HBN_", "SYN", "DS_ENV")) or name in (
            "LD_LIBRARY_PATH",
            "PYTHONPATH",
        ):
            monkeypatch.delenv(name, raising=False)
    for name, value in list(os.environ.items()):  # a plan keeps a digest of each secret of this shell
        if is_secret(name, value):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")  # exported by prefix
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")  # never printed
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text(HOSTS)


def normalized(plan: dict) -> dict:
    """Stable across runs and machines: no job id, interpreter path, deepspeed path or working directory."""
    text = json.dumps(plan).replace(plan["job_id"], "JOB").replace(sys.executable, "PYTHON")
    text = text.replace(plan["env"]["GAUDI_LAUNCH_JOB_DIR_SUFFIX"], "SUFFIX")  # drawn at random per plan
    text = text.replace(json.dumps(tempfile.gettempdir())[1:-1] + "/", "TMP/")  # the recipe cache's directory
    plan = json.loads(text)
    plan["request"]["cwd"] = "CWD"
    if "secret_digests" in plan:  # keyed with this user's random key
        plan["secret_digests"] = {k: "DIGEST" for k in plan["secret_digests"]}
    for cmd in plan["commands"]:
        argv = cmd["argv"]
        if argv[1:3] == ["-m", "gaudi_launch.backends.ds_runner"]:
            argv[4] = "TMP/" + os.path.basename(argv[4])
            argv[-2] = "--job-file=TMP/" + os.path.basename(argv[-2])
            argv[-1] = "--job-sha256=DIGEST"  # covers a random key
        cmd["env"] = {
            k: ("TMP/" + os.path.basename(v) if k == "DS_ENV_FILE" else v) for k, v in cmd["env"].items() if k != "PATH"
        }
    return plan


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_dry_run_json_matches_golden(name):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(
            [
                "--dry-run",
                "--json",
                "--no-ssh-check",
                "--hostfile",
                "hostfile",
                "--master_port",
                "29600",
                *SCENARIOS[name],
                "train.py",
                "--bf16",
                "--lr",
                "1e-4",
            ]
        )
    assert rc == 0, err.getvalue()
    assert "hf_secret_value" not in out.getvalue()
    plan = normalized(json.loads(out.getvalue()))
    path = os.path.join(GOLDEN, f"{name}.json")
    if os.environ.get("GOLDEN_UPDATE") == "1":
        with open(path, "w") as f:
            json.dump(plan, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(path) as f:
        assert plan == json.load(f)
