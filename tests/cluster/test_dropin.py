"""Issue 10 on real hosts (the namespace cluster): a selected device index means the same device on
every backend and host, remote ranks get the whole contract, and a dry run on hosts that cannot be
reached still shows the plan. The launcher runs "on" gl-n0, like a user on the first node."""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = (
    "RANK",
    "LOCAL_RANK",
    "HABANA_VISIBLE_MODULES",
    "CUDA_VISIBLE_DEVICES",
    "CROSS_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "GAUDI_LAUNCH_JOB_ID",
)
PROBE = (
    "import json, os, socket\n"
    f"keys = {KEYS!r}\n"
    "print('SEEN ' + json.dumps({'host': socket.gethostname(), **{k: os.environ.get(k) for k in keys}}),"
    " flush=True)\n"
)


def launch(cluster, *args, hosts=(0, 1), slots=4, cwd=ROOT, env=None, timeout=240):
    argv = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        cluster.hostfile(slots=slots, hosts=list(hosts)),
        "--ssh-config",
        cluster.ssh_config,
        "--grace",
        "5",
        *args,
    ]
    return cluster.run_on(0, argv, env=cluster.env(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("backend", ["mpirun", "deepspeed"])
def test_selected_devices_are_the_same_physical_ones_on_every_host_and_backend(cluster, backend, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    # This shell is restricted to modules 4-7 (exported to every host, as HABANA_* is) and GPUs 0-3
    # (this host's own: not exported). Slot N is the Nth device the rank would otherwise see.
    env = {**os.environ, "HABANA_VISIBLE_MODULES": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    res = launch(
        cluster,
        "--backend",
        backend,
        "--include",
        "gl-n0:1,3@gl-n1:0,2",
        str(tmp_path / "probe.py"),
        cwd=str(tmp_path),
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = sorted(
        (json.loads(line[line.find("SEEN ") + 5 :]) for line in res.stdout.splitlines() if "SEEN {" in line),
        key=lambda r: int(r["RANK"]),
    )
    assert [(r["host"], r["RANK"], r["LOCAL_RANK"]) for r in seen] == [
        ("gl-n0", "0", "0"),
        ("gl-n0", "1", "1"),
        ("gl-n1", "2", "0"),
        ("gl-n1", "3", "1"),
    ]
    for r in seen:
        here = r["host"] == "gl-n0"
        assert r["HABANA_VISIBLE_MODULES"] == ("5,7" if here else "4,6")
        assert r["CUDA_VISIBLE_DEVICES"] == ("1,3" if here else "0,2")
        # CROSS_SIZE (mpirun had none) and torchrun's variables on remote ranks too
        assert (r["CROSS_SIZE"], r["GROUP_WORLD_SIZE"], r["ROLE_WORLD_SIZE"]) == ("2", "2", "4")
        assert r["TORCHELASTIC_RUN_ID"] == r["GAUDI_LAUNCH_JOB_ID"]


def test_dry_run_on_unreachable_hosts_shows_the_plan_and_the_findings(cluster, tmp_path):
    # Nothing listens on port 1 of any host: every SSH connection is refused.
    args = ["--ssh-port", "1", "--ssh-timeout", "3", "--dry-run"]
    text = launch(cluster, *args, "train.py", hosts=(1, 2), slots=2)
    assert text.returncode == 3, text.stderr
    assert "backend: mpirun    world size: 4" in text.stdout
    assert "node 1  gl-n2" in text.stdout and "mpirun" in text.stdout
    assert "pre-flight: FAILED: a real run would start nothing (exit 3)" in text.stdout
    assert text.stdout.count("failed  ") >= 2 and "refused" in text.stdout
    assert "pre-flight failed" not in text.stderr and "Traceback" not in text.stderr  # the plan says it, once
    as_json = launch(cluster, *args, "--json", "train.py", hosts=(1, 2), slots=2)
    assert as_json.returncode == 3, as_json.stderr
    assert "pre-flight failed: a real run would start nothing" in as_json.stderr
    plan = json.loads(as_json.stdout)
    assert plan["world_size"] == 4 and plan["commands"][0]["argv"][0] == "mpirun"
    assert plan["preflight"]["ok"] is False
    assert [(h["host"], h["ok"]) for h in plan["preflight"]["hosts"]] == [("gl-n1", False), ("gl-n2", False)]
    assert all(h["reason"] and h["fix"] for h in plan["preflight"]["hosts"])
    # --no-ssh-check still skips it: the plan, exit 0, no findings
    skipped = launch(cluster, *args, "--json", "--no-ssh-check", "train.py", hosts=(1, 2), slots=2)
    assert skipped.returncode == 0, skipped.stderr
    assert "preflight" not in json.loads(skipped.stdout)
    # and a dry run on hosts that answer carries their findings, exit 0
    ok = launch(cluster, "--dry-run", "--json", os.path.join(ROOT, "scripts", "allreduce_smoke.py"), slots=2)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["preflight"]["ok"] is True
