"""What `gaudi-launch run plan.json` compares: two dry runs of the same options are the same job on
every backend (no false refusal), and any other change of any compared field is a difference."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from gaudi_launch.cli import main
from gaudi_launch.plan.replay import BY_RANK, FORMAT_KEY, PER_RUN, differences

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py

HOSTS = "worker-0 slots=2\nworker-1 slots=2\n"
CASES = {
    "local": ["--num_devices", "2", "--hang-timeout", "30"],
    "mpirun": ["--backend", "mpirun", "--hostfile", "hosts", "--hang-timeout", "30", "--ssh-config", "cfg"],
    "deepspeed": ["--backend", "deepspeed", "--hostfile", "hosts", "--include", "worker-0:1@worker-1"],
}


def dry_run(argv, monkeypatch, tmp) -> dict:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp / "state"))
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--no-ssh-check", "--dry-run", "--json", *argv, "-x", "HF_TOKEN", "t.py", "--lr", "1"])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.mark.parametrize("backend", sorted(CASES))
def test_the_same_options_twice_are_the_same_job(backend, isolated, monkeypatch):
    (isolated.cwd / "hosts").write_text(HOSTS)
    a, b = (dry_run(CASES[backend], monkeypatch, isolated.tmp) for _ in range(2))
    assert a["job_id"] != b["job_id"] and a["secret_digests"] == b["secret_digests"]
    assert differences(a, b, fixed_port=False) == []
    # every other field, changed anywhere, is a difference; only the per-run ones are not compared
    for key in a:
        if key in PER_RUN or key in (
            "master_port",
            FORMAT_KEY,
            BY_RANK,
        ):  # the format: on its own; BY_RANK: the version's
            continue
        changed = json.loads(json.dumps(a))
        changed[key] = {"edited": changed[key]}
        assert differences(changed, b, fixed_port=False), key
