"""Issue 27 item 5: secrets the ranks inherit from the launcher's environment (not given with -x or an
env file) are masked in what the launcher prints and logs, on the local backend and in Slurm plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

from gaudi_launch.backends import get_backend
from gaudi_launch.backends import slurm as slurm_backend
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.planner import build_plan

SECRETS = {
    "WANDB_API_KEY": "wandb-0123456789abcdef",
    "GITHUB_PAT": "ghp_patvalue987654321",
    "DATABASE_URL": "postgres://app:db-pw-55443@db.internal:5432/prod",
    "HF_TOKEN": 'hf_q"zq8\\te-771',  # a quote and a backslash: escaped differently by repr and JSON
}
PRINTS = """\
import json, os
for name in ("WANDB_API_KEY", "GITHUB_PAT", "DATABASE_URL", "HF_TOKEN"):
    print(name, os.environ[name], repr(os.environ[name]), json.dumps(os.environ[name]), flush=True)
print("password alone:", os.environ["DATABASE_URL"].split(":")[2].split("@")[0], flush=True)
"""
FRAGMENTS = ["0123456789abcdef", "patvalue987654321", "db-pw-55443", "zq8", "te-771"]


def test_secrets_inherited_from_the_launchers_environment_never_print_on_the_local_backend(tmp_path):
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    logs = tmp_path / "logs"
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", "--log-dir", str(logs), str(script)],
        env={**os.environ, **SECRETS},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    shown = res.stdout + res.stderr + (logs / "rank-0.log").read_text()
    assert shown.count("***") >= 13, shown  # 4 names x 3 forms, and the password alone
    for fragment in FRAGMENTS:
        assert fragment not in shown, shown


def test_a_slurm_plan_masks_every_secret_srun_exports_to_the_ranks():
    # srun --export=ALL: the ranks get the launcher's whole environment, not only the exported prefixes
    environ = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gn[01-02]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "PATH": "/usr/bin",
        **SECRETS,
    }
    plan = build_plan(
        JobSpec(program=["train.py"], backend="slurm", efa=False, env={"RUN_NOTE": "x"}),
        environ=environ,
        backends=lambda name: types.SimpleNamespace(
            detect=lambda plan, env: slurm_backend.probe_allocation(plan, env, lambda *a, **k: (None, None)),
            commands=slurm_backend.commands,
        ),
    )
    for name, value in SECRETS.items():
        for form in (value, repr(value), json.dumps(value)):
            assert plan.mask(f"[0] {name}={form}") in (f"[0] {name}=***", f"[0] {name}='***'", f'[0] {name}="***"')
    assert plan.mask("pw db-pw-55443") == "pw ***"
    shown = plan.to_json() + plan.render_text()
    assert not any(fragment in shown for fragment in FRAGMENTS)


def test_a_url_with_a_password_is_masked_in_a_plan_and_taken_back_from_the_shell(tmp_path):
    import pytest

    from gaudi_launch.errors import UserError
    from gaudi_launch.plan.planner import build_plan
    from gaudi_launch.plan.replay import spec_from_request

    url = SECRETS["DATABASE_URL"]
    spec = JobSpec(program=["train.py"], num_devices=1, env={"DATABASE_URL": url, "GITHUB_PAT": "ghp_x12345"})
    saved = json.loads(
        build_plan(spec, environ={"PATH": "/bin"}, require_program=False, backends=get_backend).to_json()
    )
    assert saved["request"]["env"] == {"DATABASE_URL": "***", "GITHUB_PAT": "***"}
    assert saved["env"]["DATABASE_URL"] == "***" and "db-pw-55443" not in json.dumps(saved)
    again = spec_from_request(saved["request"], {"DATABASE_URL": url, "GITHUB_PAT": "ghp_x12345"}, "plan.json")
    assert again.env == {"DATABASE_URL": url, "GITHUB_PAT": "ghp_x12345"}
    with pytest.raises(UserError, match="DATABASE_URL is masked in the plan"):
        spec_from_request(saved["request"], {"GITHUB_PAT": "ghp_x12345"}, "plan.json")
