"""The slurm backend's decisions, from crafted Slurm variables: no Slurm needed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import types

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.backends import slurm as backend
from gaudi_launch.cli import main
from gaudi_launch.errors import UserError
from gaudi_launch.inputs import slurm
from gaudi_launch.inputs.envfile import is_secret
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import slurm as plan_slurm
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.process.worker import normalize_env

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "golden")  # tests/golden
ALLOC = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gn[01-03]",
    "SLURM_TASKS_PER_NODE": "2(x3)",
    "PATH": "/usr/bin:/bin",
}


def probing(facts, error=None):
    """The slurm backend's planning half, its node probe (srun) seeing ``facts`` ({node: HostFacts fields})."""
    found = {n: HostFacts(host=n, ok=True, **f) for n, f in facts.items()} if facts is not None else None
    return types.SimpleNamespace(
        detect=lambda plan, environ: backend.probe_allocation(plan, environ, lambda *a, **k: (found, error)),
        commands=backend.commands,
    )


def plan_for(environ=None, facts=None, error=None, **spec):
    return build_plan(
        JobSpec.build(program=["train.py", "--bf16"], backend="slurm", efa=False, **spec),
        environ=dict(ALLOC if environ is None else environ),
        backends=lambda name: probing(facts, error),
    )


@pytest.mark.parametrize(
    "text,names",
    [
        ("gls-n[0-2]", ["gls-n0", "gls-n1", "gls-n2"]),
        ("a1,b[08-10],c", ["a1", "b08", "b09", "b10", "c"]),
        ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
    ],
)
def test_host_list_expanded_as_scontrol_does(text, names):
    assert slurm.expand_hostlist(text) == names


def test_tasks_per_node_and_port():
    assert slurm.parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.port_for_job("4242") == 24242 and slurm.port_for_job("24242") == 24242
    with pytest.raises(UserError):
        slurm.parse_tasks_per_node("2(y3)")


def test_the_master_port_is_not_derived_from_the_public_job_id():
    """Issue 36 item 9: squeue shows every job's id to every user; a port that follows from it can be taken first.
    The launcher draws it at random, inside an allocation and from a login node, and srun's environment (which
    no other user can read) carries it to the ranks."""
    inside = [plan_for() for _ in range(3)]
    assert {p.master_port for p in inside} != {slurm.port_for_job("4242")}
    login = [plan_for(environ={"PATH": "/bin"}, num_nodes=2) for _ in range(3)]  # srun allocates the nodes
    for plan in inside + login:
        assert slurm.PORT_BASE <= plan.master_port < slurm.PORT_BASE + slurm.PORT_SPAN
        assert plan.commands[0].env["MASTER_PORT"] == str(plan.master_port)
        assert str(plan.master_port) not in " ".join(plan.commands[0].argv)  # not on srun's argv (ps)


def test_auto_is_slurm_inside_an_allocation_only():
    spec = JobSpec(program=["t.py"], num_devices=1)
    assert plan_slurm.wanted(spec, ALLOC)
    assert not plan_slurm.wanted(spec, {**ALLOC, "SLURM_STEP_ID": "0"})  # gaudi-launch run by srun itself
    assert not plan_slurm.wanted(spec, {})
    assert not plan_slurm.wanted(JobSpec(program=["t.py"], hostfile="h"), ALLOC)


def test_plan_inside_allocation_from_slurm_facts():
    plan = plan_for()
    assert [n.host for n in plan.nodes] == ["gn01", "gn02", "gn03"]
    assert [n.ranks for n in plan.nodes] == [[0, 1], [2, 3], [4, 5]]
    assert plan.master_addr == "gn01" and slurm.PORT_BASE <= plan.master_port < slurm.PORT_BASE + slurm.PORT_SPAN
    cmd = plan.commands[0]
    assert cmd.argv[:9] == [
        "srun",
        f"--job-name=gaudi-launch-{plan.job_id}",
        "--nodes=3",
        "--ntasks=6",
        "--ntasks-per-node=2",
        "--nodelist=gn01,gn02,gn03",
        "--kill-on-bad-exit=1",
        "--label",
        f"--export=ALL,GAUDI_LAUNCH_JOB_ID={plan.job_id}",
    ]
    assert cmd.argv[9:] == [sys.executable, "-u", "-m", "gaudi_launch.process.worker", "train.py", "--bf16"]
    assert cmd.env["MASTER_ADDR"] == "gn01" and cmd.env["MASTER_PORT"] == str(plan.master_port)
    # sbatch --cpus-per-task reaches the ranks' step (srun no longer inherits it since Slurm 22.05)
    argv = plan_for(environ={**ALLOC, "SLURM_CPUS_PER_TASK": "10"}).commands[0].argv
    assert argv[6] == "--cpus-per-task=10" and "--cpus-per-task=10" not in cmd.argv


def test_selection_as_for_hostfiles():
    plan = plan_for(exclude="gn02", num_devices=1, master_port=29600)
    assert [(n.host, n.ranks) for n in plan.nodes] == [("gn01", [0]), ("gn03", [1])]
    assert "--nodelist=gn01,gn03" in plan.commands[0].argv and plan.master_port == 29600
    plan = plan_for(num_nodes=2)
    assert "--nodelist=gn01,gn02" in plan.commands[0].argv
    plan = plan_for(include="gn02:1@gn03:1")  # a device subset travels as on the other backends
    assert plan.env["GAUDI_LAUNCH_NODE_DEVICES"] == "1;1"
    with pytest.raises(UserError, match="uneven"):
        plan_for(include="gn02:1@gn03")
    with pytest.raises(UserError, match="only 3"):
        plan_for(num_nodes=4)


def test_plan_from_login_node():
    plan = plan_for(
        environ={"PATH": "/bin"},
        num_nodes=2,
        num_devices=8,
        partition="gaudi",
        time="1:00:00",
        account="proj",
        slurm_args="--exclusive --comment 'a b'",
    )
    argv = plan.commands[0].argv
    assert argv[:5] == [
        "srun",
        f"--job-name=gaudi-launch-{plan.job_id}",
        "--nodes=2",
        "--ntasks=16",
        "--ntasks-per-node=8",
    ]
    assert argv[5:14] == [
        "--kill-on-bad-exit=1",
        "--label",
        f"--export=ALL,GAUDI_LAUNCH_JOB_ID={plan.job_id}",
        "--partition=gaudi",
        "--time=1:00:00",
        "--account=proj",
        "--exclusive",
        "--comment",
        "a b",
    ]
    assert "MASTER_ADDR" not in plan.commands[0].env  # the ranks take the step's first node
    with pytest.raises(UserError, match="inside an allocation"):
        plan_for(environ={}, include="n1:0,1")
    assert "--exclude=n1,n2" in plan_for(environ={}, exclude="n1@n2").commands[0].argv


def test_bad_input_is_a_clear_error():
    with pytest.raises(UserError, match="hostfile"):
        plan_for(hostfile="h")
    with pytest.raises(UserError, match="slurm-args"):
        plan_for(slurm_args="'unclosed")
    with pytest.raises(UserError, match="LOCAL_RANK"):
        plan_for(append_local_rank=True)


def test_values_travel_in_srun_environment_not_argv():
    secret = 'x $(touch /tmp/p) "q"\n\'s'
    plan = plan_for(env={"MY_VALUE": secret, "HF_TOKEN": "tok-123456"})
    env = backend.srun_env(plan, {**ALLOC, "RANK": "7", "MASTER_ADDR": "stale", "HOME": "/root"})
    assert env["MY_VALUE"] == secret and env["HOME"] == "/root" and env[slurm.RANKS_FROM] == "slurm"
    assert env["MASTER_ADDR"] == "gn01" and "RANK" not in env
    assert "GAUDI_LAUNCH_JOB_ID" not in env  # on srun's argv only: the job-id sweep must not hit srun
    assert not any(secret in a or "tok-123456" in a for a in plan.commands[0].argv)
    assert "tok-123456" not in plan.to_json()


def test_rank_layout_from_srun_variables():
    env = {
        slurm.RANKS_FROM: "slurm",
        "GAUDI_LAUNCH_JOB_ID": "j",
        "RANK": "99",
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "c[5-6]",
    }
    out = normalize_env(env)
    assert {
        k: out[k]
        for k in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "CROSS_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GROUP_WORLD_SIZE",
        )
    } == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "CROSS_SIZE": "2",
        "MASTER_ADDR": "c5",
        "MASTER_PORT": "20007",
        "GROUP_WORLD_SIZE": "2",
    }
    given = normalize_env({**env, "MASTER_ADDR": "m", "MASTER_PORT": "29600"})
    assert "MASTER_ADDR" not in given and "MASTER_PORT" not in given  # the launcher's are kept


def test_srun_output_read_back():
    demux = backend.srun_demux()
    assert demux(" 3: hello: world") == [(3, "hello: world")]
    assert demux("srun: error: gn02: task 3: Exited with exit code 7") == [
        (None, "srun: error: gn02: task 3: Exited with exit code 7")
    ]
    lines = ["srun: error: gn02: task 3: Exited with exit code 7", "srun: error: gn01: tasks 0-1: Terminated"]
    culprit = backend.explain(lines)
    assert (culprit.rank, culprit.host, culprit.status, culprit.exit_code) == (3, "gn02", "exit code 7", 7)
    assert backend.task_failed(lines[1]) and not backend.task_failed(" 0: srun: error: x")
    assert backend.explain(["srun: error: gn01: task 0: Segmentation fault"]).status == "Segmentation fault"


def test_dry_run_needs_no_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, no scontrol
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--backend", "slurm", "--num_nodes", "2", "--num_devices", "2", "--dry-run", "t.py"])
    assert rc == 0, err.getvalue()
    assert "srun --job-name=gaudi-launch-" in out.getvalue() and "--ntasks=4" in out.getvalue()


@pytest.mark.parametrize(
    "name,args,environ",
    [
        (
            "slurm-allocation",
            ["--exclude", "gaudi2", "--no-ssh-check"],
            {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gaudi[1-3]", "SLURM_NTASKS_PER_NODE": "8"},
        ),
        (
            "slurm-login",
            [
                "--backend",
                "slurm",
                "--num_nodes",
                "2",
                "--num_devices",
                "8",
                "--partition",
                "gaudi2",
                "--time",
                "2:00:00",
                "--account",
                "ml",
                "--slurm-args",
                "--exclusive --mem=0",
            ],
            {},
        ),
    ],
)
def test_dry_run_json_matches_golden(name, args, environ, monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith(("SLURM_", "HCCL_", "PT_HPU", "HABANA_", "GC_", "HLS_", "HBN_", "SYN", "DS_ENV")) or key in (
            "LD_LIBRARY_PATH",
            "PYTHONPATH",
        ):
            monkeypatch.delenv(key, raising=False)
    for key, value in list(os.environ.items()):  # a plan keeps a digest of each secret of this shell
        if is_secret(key, value):
            monkeypatch.delenv(key)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setattr(slurm, "draw_port", lambda: 21234)  # drawn at random per run
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--dry-run", "--json", "--no-efa", *args, "train.py", "--bf16"])
    assert rc == 0, err.getvalue()
    assert "hf_secret_value" not in out.getvalue()
    data = json.loads(out.getvalue())
    text = json.dumps(data).replace(data["job_id"], "JOB").replace(sys.executable, "PYTHON")
    text = text.replace(data["env"]["GAUDI_LAUNCH_JOB_DIR_SUFFIX"], "SUFFIX")  # drawn at random per plan
    text = text.replace(str(tmp_path), "HOME")
    text = text.replace(json.dumps(tempfile.gettempdir())[1:-1] + "/", "TMP/")  # the recipe cache's directory
    plan = json.loads(text)
    plan["secret_digests"] = {k: "DIGEST" for k in plan["secret_digests"]}  # keyed with this user's random key
    path = os.path.join(GOLDEN, f"{name}.json")
    if os.environ.get("GOLDEN_UPDATE") == "1":
        with open(path, "w") as f:
            json.dump(plan, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(path) as f:
        assert plan == json.load(f)


def test_planner_hands_slurm_plans_over(monkeypatch):
    plan = build_plan(
        JobSpec(program=["t.py"], efa=False), environ={**ALLOC, "SLURM_JOB_NODELIST": "x[1-2]"}, backends=get_backend
    )
    assert plan.backend == "slurm" and [n.host for n in plan.nodes] == ["x1", "x2"]


def test_job_id_sweep_runs_beside_the_step_on_every_node():
    plan = plan_for(num_nodes=2)
    argv = backend.sweep_argv(plan, JobSpec(program=["t.py"]), "4242", ["gn01", "gn02"], 15, 100.0)
    assert argv[:9] == [
        "srun",
        "--overlap",
        "--jobid=4242",
        f"--job-name=gaudi-launch-{plan.job_id}-sweep",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=gn01,gn02",
        "--label",
    ]
    assert argv[-3:] == [plan.job_id, "15", "100.0"]
    found = backend.parse_sweep_output("0: 2\n1: 0\n1: 77\tpython\t0\tnot allowed to signal it\n", ["gn01", "gn02"])
    assert found["gn01"].hit == 2 and found["gn02"].hit == 0
    assert found["gn02"].unseen == ["pid 77 (python, uid 0): not allowed to signal it"]


def test_the_sweep_hands_each_node_the_groups_its_ranks_led(tmp_path):
    """One srun argv serves every node: each task takes its node's groups (issue 36 item 9)."""
    import subprocess
    import sys

    plan = plan_for(num_nodes=2)
    argv = backend.sweep_argv(plan, JobSpec(program=["t.py"]), "4242", ["gn01", "gn02"], 0, 100.0, {"gn02": {77, 9}})
    assert argv[-4:] == [plan.job_id, "0", "100.0", "/9,77"]  # gn01 (task 0): none; gn02 (task 1): 9 and 77
    code = argv[argv.index("-c") + 1] + "\nprint(sorted(groups))"
    for task, want in (("0", "[]"), ("1", "['77', '9']")):
        out = subprocess.run(
            [sys.executable, "-S", "-c", code, *argv[-4:]],
            env={"SLURM_PROCID": task},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.splitlines()[-1] == want, out.stderr


def test_interface_from_what_srun_found_on_the_nodes():
    def ip(addr, other="10.9.0.5/16"):
        return (
            f"1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {other} brd x scope global eth0\n"
            f"3: ens5    inet {addr}/24 brd x scope global ens5\n"
        )

    facts = {
        "gn01": {"ip_addr": ip("10.1.0.11"), "master_ip": "10.1.0.11"},
        "gn02": {"ip_addr": ip("10.1.0.12"), "master_ip": "10.1.0.11"},
        "gn03": {"ip_addr": ip("10.1.0.13"), "master_ip": "10.1.0.11"},
    }
    plan = plan_for(facts=facts)
    assert (
        plan.ifname == "ens5" and plan.env["GLOO_SOCKET_IFNAME"] == "ens5" and plan.env["HCCL_SOCKET_IFNAME"] == "ens5"
    )
    mine = plan_for(environ={**ALLOC, "HCCL_SOCKET_IFNAME": "eth0"}, facts=facts)
    assert mine.ifname == "eth0" and "HCCL_SOCKET_IFNAME" not in mine.env  # the user's own, inherited
    assert plan_for(facts=None).ifname is None  # srun could not probe: defaults, with a note
    assert plan_for(facts=facts, ssh_check=False).ifname is None  # --no-ssh-check: no probe
    with pytest.raises(UserError, match="HCCL_SOCKET_IFNAME"):
        plan_for(facts={**facts, "gn03": {"ip_addr": ip("10.2.0.13"), "master_ip": None}})
    assert "nodes not probed: srun said srun: error: x" in plan_for(error="srun: error: x").notes
    # the master node's own name in its /etc/hosts as 127.0.1.1 is no address the others reach: not used
    looped = plan_for(facts={h: {**f, "master_ip": "127.0.1.1"} for h, f in facts.items()})
    assert looped.ifname is None and "gn01 does not resolve here nor on gn01: left to defaults" in "\n".join(
        looped.notes
    )


def test_srun_runs_the_probe_every_host_gets_and_its_output_becomes_each_nodes_facts(tmp_path):
    """One srun task per node runs probe.sh (as the ssh pre-flight and the local backend do); its labelled
    output is read into each node's HostFacts, the master port's answer kept for the master node only."""
    import subprocess

    argv = backend.probe_argv(["gn01", "gn02"], "4242", "gn01", sys.executable, "t.py", 29500, str(tmp_path))
    assert argv[:3] == ["srun", "--overlap", "--jobid=4242"] and argv[-3:-1] == ["sh", "-c"]
    (tmp_path / "t.py").write_text("")
    # the line srun would run on each node, run here twice as tasks 0 and 1 (srun --label's prefixes)
    out = subprocess.run(["sh", "-c", argv[-1]], capture_output=True, text=True, timeout=60).stdout
    labelled = "".join(f"{task}: {line}\n" for task in (0, 1) for line in out.splitlines())
    facts = backend.read_probe_output(labelled, ["gn01", "gn02"], "gn01", "t.py", str(tmp_path))
    assert list(facts) == ["gn01", "gn02"] and all(isinstance(f, HostFacts) for f in facts.values())
    here = facts["gn01"]
    assert here.python_ok and here.script_ok and here.cwd == str(tmp_path) and here.ncpus == os.cpu_count()
    assert here.master_reachable is None  # port 0: nothing listens for the master yet, only its name resolved
    assert facts["gn02"].port_free is None and here.port_free is not None
    assert backend.read_probe_output(labelled.replace("@@gaudi-launch-probe end", ""), ["gn01"], "gn01") == {}


def test_a_node_without_the_script_or_interpreter_stops_the_job_before_it_starts():
    ok = {"ip_addr": "", "master_ip": None, "script_ok": True, "cwd": "/w", "python_ok": True}
    with pytest.raises(plan_slurm.NodeCheckFailed, match="train.py does not exist on gn02") as exc:
        plan_for(facts={"gn01": ok, "gn02": {**ok, "script_ok": False}, "gn03": ok})
    assert exc.value.exit_code == 3 and exc.value.where == "gn02"
    with pytest.raises(plan_slurm.NodeCheckFailed, match=r"port \d+ is in use on gn01"):
        plan_for(facts={"gn01": {**ok, "port_free": False}, "gn02": ok, "gn03": ok})
    with pytest.raises(plan_slurm.NodeCheckFailed, match="hl-smi sees 1 Gaudi device.s. on gn03, 2 needed"):
        plan_for(facts={"gn01": {**ok, "devices": 8}, "gn02": ok, "gn03": {**ok, "devices": 1}})
    with pytest.raises(plan_slurm.NodeCheckFailed, match="interpreter /nope/python is not found .* on gn02"):
        plan_for(facts={"gn01": ok, "gn02": {**ok, "python_ok": False}, "gn03": ok}, python="/nope/python")


def test_where_the_watch_probes_each_node():
    shown = (
        "NodeName=gn01 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.1.0.11 NodeHostName=gn01 State=ALLOCATED\n"
        "NodeName=gn02 Arch=x86_64 NodeHostName=gn02 State=ALLOCATED\n"
    )
    assert backend.parse_node_addrs(shown) == {"gn01": "10.1.0.11", "gn02": "gn02"}
    assert backend.parse_slurmd_port("SlurmctldPort = 6817\nSlurmdPort              = 7001\n") == 7001
    assert backend.parse_slurmd_port("") == 6818


def test_check_only_and_job_file_with_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["--backend", "slurm", "--check-only"]) == 2
    assert "--check-only" in err.getvalue() and "Traceback" not in err.getvalue()
    (tmp_path / "job.yaml").write_text('backend: slurm\nnum_nodes: 2\ntime: "1:00:00"\naccount: ml\n')
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--config", "job.yaml", "--dry-run", "--json", "t.py"]) == 0
    argv = json.loads(out.getvalue())["commands"][0]["argv"]
    assert "--time=1:00:00" in argv and "--account=ml" in argv and "--nodes=2" in argv


@pytest.mark.parametrize("value", ["x $(y) `z` \"q\" 's'", "a\nb\tc\\n\\", "", "$HOME ${X}", "ünï\r\n"])
def test_sbatch_env_file_reads_back_exactly(value):
    from gaudi_launch.inputs.envfile import parse_env_text
    from gaudi_launch.plan.sbatch import env_file_text

    assert parse_env_text(env_file_text({"V": value, "W": "1"}), "f") == {"V": value, "W": "1"}


def test_sbatch_script_for_the_job(tmp_path, monkeypatch):
    from gaudi_launch.plan import sbatch

    monkeypatch.chdir(tmp_path)
    plan = plan_for(
        environ={},
        num_nodes=2,
        num_devices=8,
        partition="gaudi2",
        time="1:00:00",
        slurm_args="--exclusive",
        env={"TOKEN_X": "s3cret value"},
        sbatch="job.sh",
        grace=5.0,
    )
    spec = JobSpec.build(
        program=["train.py", "--bf16", "a b"],
        backend="slurm",
        num_nodes=2,
        num_devices=8,
        partition="gaudi2",
        time="1:00:00",
        slurm_args="--exclusive",
        sbatch="job.sh",
        grace=5.0,
    )
    written = sbatch.write(plan, spec, {})
    text = open(written["script"]).read()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n" in text and "#SBATCH --partition=gaudi2\n" in text
    assert "#SBATCH --time=1:00:00\n" in text and "#SBATCH --exclusive\n" in text
    assert (
        text.rstrip()
        .splitlines()[-1]
        .endswith(f"--env-file {written['env_file']} --python {sys.executable} train.py --bf16 'a b'")
    )
    assert "s3cret" not in text and oct(os.stat(written["env_file"]).st_mode & 0o777) == "0o600"
    with pytest.raises(UserError, match="exists already"):
        sbatch.write(plan, spec, {})
    with pytest.raises(UserError, match="login node"):
        plan_for(sbatch="job.sh")


def test_srun_failing_itself_is_not_blamed_on_a_rank():
    culprit = backend.explain(
        ["srun: error: Unable to create step for job 1: More processors requested than permitted"]
    )
    assert culprit.rank is None and "--overcommit" in culprit.status and culprit.exit_code is None
    # a task's report wins over srun's own words
    assert backend.explain(["srun: error: x", "srun: error: n2: task 1: Exited with exit code 3"]).rank == 1
