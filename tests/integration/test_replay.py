"""`gaudi-launch run plan.json` (--from-plan): the job a dry run showed, run as it was, or nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.replay import differences, spec_from_request

# Each rank records what it was given: its working directory, argv, job id and a secret's check.
SCRIPT = """import json, os, sys, time
rank, out = os.environ["RANK"], os.environ["OUT"]
with open(os.path.join(out, f"rank-{rank}.tmp"), "w") as f:
    json.dump({"cwd": os.getcwd(), "argv": sys.argv[1:], "job": os.environ["GAUDI_LAUNCH_JOB_ID"],
               "world": os.environ["WORLD_SIZE"], "token_ok": os.environ.get("HF_TOKEN") == "hf_replaysecret",
               "foo": os.environ.get("FOO")}, f)
os.replace(os.path.join(out, f"rank-{rank}.tmp"), os.path.join(out, f"rank-{rank}.json"))
# A failing rank tears the others down: fail only once every rank has written its record.
deadline = time.time() + 60
while len([n for n in os.listdir(out) if n.endswith(".json")]) < int(os.environ["WORLD_SIZE"]) and time.time() < deadline:
    time.sleep(0.02)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def gl(*args, cwd, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    """Where plans' secret digests keep their key ($XDG_STATE_HOME/gaudi-launch): not the real home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def job(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "train.py").write_text(SCRIPT)
    (work / "hosts").write_text("localhost slots=3\n")
    return work, out


def dry_run(work, out, *extra, env=None):
    res = gl(
        "--dry-run",
        "--json",
        "--hostfile",
        "hosts",
        "--num_devices",
        "2",
        "-x",
        f"OUT={out}",
        "-x",
        "FOO=bar",
        *extra,
        "train.py",
        "--lr",
        "0.1",
        cwd=work,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    path = work / "plan.json"
    path.write_text(res.stdout)
    return path, json.loads(res.stdout)


def ranks(out):
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}


def test_a_plan_runs_as_the_dry_run_showed_it_from_anywhere(job, tmp_path):
    work, out = job
    path, saved = dry_run(work, out, "-x", "HF_TOKEN", env={"HF_TOKEN": "hf_replaysecret", "EXIT": "3"})
    assert saved["request"]["env"]["HF_TOKEN"] == "***" and "hf_replaysecret" not in path.read_text()
    res = gl("run", str(path), cwd=tmp_path, env={"HF_TOKEN": "hf_replaysecret", "EXIT": "3"})
    assert res.returncode == 3, res.stderr  # the job's own exit code
    seen = ranks(out)
    assert sorted(seen) == [0, 1]
    for r in seen.values():
        # in the plan's directory, the script's arguments, the job's variables, the secret from this shell
        assert r["cwd"] == str(work) and r["argv"] == ["--lr", "0.1"] and r["world"] == "2"
        assert r["token_ok"] and r["foo"] == "bar"
        assert r["job"] != saved["job_id"]  # a job of its own: a fresh id
    assert "hf_replaysecret" not in res.stdout + res.stderr


def test_a_changed_hostfile_starts_nothing_and_says_what_differs(job, tmp_path):
    work, out = job
    path, _ = dry_run(work, out)
    (work / "hosts").write_text("127.0.0.1 slots=3\n")  # the same host by another name: still another plan
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 2
    assert f"{path}: the job planned now is not the one in the plan" in res.stderr
    assert 'nodes[0].host: the plan has "localhost", now "127.0.0.1"' in res.stderr
    assert not list(out.iterdir())  # nothing ran


def test_a_masked_secret_must_come_from_the_shell(job, tmp_path):
    work, out = job
    path, _ = dry_run(work, out, "-x", "HF_TOKEN", env={"HF_TOKEN": "hf_replaysecret"})
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "run", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert f"{path}: HF_TOKEN is masked in the plan" in res.stderr and "export HF_TOKEN" in res.stderr
    assert not list(out.iterdir())


def test_run_dry_run_shows_the_same_plan_with_a_fresh_job(job, tmp_path):
    work, out = job
    path, saved = dry_run(work, out)
    res = gl("run", "--dry-run", "--json", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert differences(saved, again, fixed_port=False) == []
    assert again["request"] == saved["request"] and again["job_id"] != saved["job_id"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num_devices", "1"], "--num_devices: a plan brings all its options"),
        (["train.py"], "SCRIPT: a plan brings all its options"),
    ],
)
def test_a_plan_takes_no_other_options(job, extra, message):
    work, out = job
    path, _ = dry_run(work, out)
    res = gl("--from-plan", str(path), *extra, cwd=work)
    assert res.returncode == 2 and message in res.stderr


def test_what_is_not_a_plan_is_named_with_its_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "backend": "local",\n  oops\n}\n')
    res = gl("run", str(bad), cwd=tmp_path)
    assert res.returncode == 2 and f"{bad}:3: not a plan: invalid JSON" in res.stderr
    old = tmp_path / "old.json"
    old.write_text('{"backend": "local"}')
    res = gl("run", str(old), cwd=tmp_path)
    assert res.returncode == 2 and "it has no 'request'" in res.stderr
    res = gl("run", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert res.returncode == 2 and "cannot read the plan" in res.stderr
    res = gl("run", cwd=tmp_path)
    assert res.returncode == 2 and "run takes one plan" in res.stderr


def test_every_option_survives_the_round_trip():
    spec = JobSpec.build(
        program=["t.py", "--x"],
        hostfile="h",
        include="a:0@b",
        num_nodes=2,
        num_devices=4,
        backend="deepspeed",  # and its own options below
        master_addr="10.0.0.1",
        master_port=29511,
        env={"A": "1"},
        module=False,
        python="/usr/bin/python3",
        append_local_rank=True,
        log_dir="/tmp/l",
        grace=3.0,
        ssh_port=3022,
        ssh_identity="/k",
        ssh_config="/c",
        ssh_timeout=4.0,
        strict_host_keys=True,
        ssh_check=False,
        export_prefixes=["NCCL_"],
        efa=False,
        hccl_ofi_wrapper="/w",
        launcher="openmpi",
        launcher_args="-x",
        console_ranks=[0],
        max_restarts=2,
        restart_on="rank",
        restart_backoff=0.5,
        hang_timeout=30.0,
    )
    request = json.loads(json.dumps(spec.as_request("/somewhere")))
    assert spec_from_request(request, {}, "p.json") == spec


def test_a_request_with_options_unknown_here_is_refused():
    request = JobSpec(program=["t.py"]).as_request("/")
    with pytest.raises(UserError, match="does not know: turbo"):
        spec_from_request({**request, "turbo": True}, {}, "p.json")
    with pytest.raises(UserError, match="masked in the plan's program"):
        spec_from_request({**request, "program": ["t.py", "--token", "***"]}, {}, "p.json")


def edit(path, change) -> None:
    plan = json.loads(path.read_text())
    change(plan)
    path.write_text(json.dumps(plan, indent=2))


def set_python(plan, python):
    plan["request"]["python"] = python


@pytest.mark.parametrize(
    "change, what",
    [
        # another interpreter in the request alone, or in the commands alone: refused before anything runs
        (lambda p, evil: set_python(p, evil), "python: the plan's commands do not run"),
        (lambda p, evil: [c["argv"].__setitem__(0, evil) for c in p["commands"]], "python: the plan's commands do"),
        # a variable slipped into the request: the environment planned now is not the plan's
        (lambda p, evil: p["request"]["env"].update(LD_PRELOAD=evil), "env.LD_PRELOAD: the plan has (absent)"),
        # a field this version does not make is a difference, not something to ignore
        (lambda p, evil: p.update(turbo=True), "turbo: the plan has true, now (absent)"),
    ],
)
def test_an_edited_plan_starts_nothing(job, tmp_path, change, what):
    work, out = job
    evil = tmp_path / "evil-python"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'PWNED'}\n")
    evil.chmod(0o755)
    path, _ = dry_run(work, out)
    edit(path, lambda p: change(p, str(evil)))
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "the job planned now is not the one in the plan" in res.stderr and what in res.stderr
    assert not (tmp_path / "PWNED").exists() and not list(out.iterdir())


def test_an_edited_ssh_config_is_refused_before_any_ssh(tmp_path):
    # A plan for two hosts that do not exist (its pre-flight fails: exit 3, the plan is still written).
    # An ssh config with a local ProxyCommand must not run, not even in the replay's pre-flight.
    (tmp_path / "hosts").write_text("worker-0 slots=1\nworker-1 slots=1\n")
    (tmp_path / "t.py").write_text("")
    res = gl(
        "--dry-run", "--json", "--backend", "mpirun", "--hostfile", "hosts", "--ssh-timeout", "2", "t.py", cwd=tmp_path
    )
    assert res.returncode == 3, res.stderr
    path = tmp_path / "plan.json"
    path.write_text(res.stdout)
    (tmp_path / "evil_config").write_text(f"Host *\n  ProxyCommand touch {tmp_path / 'PWNED'}\n")
    edit(path, lambda p: p["request"].update(ssh_config=str(tmp_path / "evil_config")))
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 2 and "ssh_args: the plan has" in res.stderr, res.stderr
    assert not (tmp_path / "PWNED").exists()


def test_a_changed_secret_is_caught_by_its_keyed_digest(job, tmp_path, state_home):
    work, out = job
    path, saved = dry_run(work, out, "-x", "HF_TOKEN", env={"HF_TOKEN": "hf_replaysecret"})
    text = path.read_text()
    digest = saved["secret_digests"]["HF_TOKEN"]
    # neither the value nor a plain hash of it: a key only this user can read makes the digest
    assert "hf_replaysecret" not in text and hashlib.sha256(b"hf_replaysecret").hexdigest() not in text
    assert len(digest) == 64 and oct(os.stat(state_home / "gaudi-launch").st_mode & 0o777) == "0o700"
    res = gl("run", str(path), cwd=tmp_path, env={"HF_TOKEN": "hf_othervalue"})
    assert res.returncode == 2, res.stderr
    assert "HF_TOKEN: its value here is not the one the plan was made with" in res.stderr
    assert "hf_othervalue" not in res.stderr and "hf_replaysecret" not in res.stderr and digest not in res.stderr
    assert not list(out.iterdir())
    # a plan whose digest was removed does not run with whatever value this shell has
    edit(path, lambda p: p.pop("secret_digests"))
    res = gl("run", str(path), cwd=tmp_path, env={"HF_TOKEN": "hf_replaysecret"})
    assert res.returncode == 2 and "HF_TOKEN: the plan holds no digest of it" in res.stderr, res.stderr
    assert not list(out.iterdir())


def test_a_plan_that_predates_an_option_runs_with_its_default_and_says_so(job, tmp_path):
    # A plan written before an option existed has no key for it: the option takes its default (said
    # once), and the plan still runs, instead of failing on a 'request' that differs.
    work, out = job
    path, saved = dry_run(work, out)
    edit(path, lambda p: (p["request"].pop("hang_timeout"), p["request"].pop("grace"), p.pop("plan_format", None)))
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(ranks(out)) == [0, 1]
    assert "predates the options --grace, --hang-timeout: taken at their defaults" in res.stderr


def test_a_difference_deep_in_the_plan_names_its_key(job, tmp_path):
    work, out = job
    path, _ = dry_run(work, out)
    edit(path, lambda p: p["commands"][1]["env"].update(FOO="baz"))
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert 'commands[1].env.FOO: the plan has "baz", now (absent)' in res.stderr, res.stderr
    assert "commands[0]" not in res.stderr  # only what differs


def test_a_plan_of_a_newer_format_is_refused_naming_both_formats(job, tmp_path):
    work, out = job
    path, saved = dry_run(work, out)
    assert saved["plan_format"] >= 2
    edit(path, lambda p: p.update(plan_format=p["plan_format"] + 1))
    res = gl("run", str(path), cwd=tmp_path)
    assert res.returncode == 2 and "plan format" in res.stderr and "newer gaudi-launch" in res.stderr, res.stderr
    assert not list(out.iterdir())
