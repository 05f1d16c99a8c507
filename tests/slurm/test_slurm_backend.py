"""The slurm backend on a real Slurm cluster (3 nodes in network namespaces, tests/slurm/slurmcluster.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = os.path.join(REPO, "tests", "slurm", "slurm_rank.py")
ALLREDUCE = os.path.join(REPO, "scripts", "allreduce_smoke.py")
LAUNCH = [sys.executable, "-m", "gaudi_launch"]
OUTSIDE = [*LAUNCH, "--backend", "slurm", "--num_nodes", "2", "--num_devices", "2", "--grace", "3"]


def launch(cluster, argv, timeout=180, env=None):
    return subprocess.run(argv, cwd=REPO, env=env or cluster.env(), capture_output=True, text=True, timeout=timeout)


def layouts(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        if "LAYOUT " in line:
            data = json.loads(line.split("LAYOUT ", 1)[1])
            out[int(data["RANK"])] = data
    return out


def no_job_processes(cluster) -> bool:
    return all(not cluster.job_processes(i) for i in range(cluster.n))


def test_allreduce_inside_salloc(slurm_cluster):
    # Inside an allocation, with no hostfile: the backend is slurm, the nodes are the allocation's.
    r = launch(slurm_cluster, ["salloc", "-N2", "--ntasks-per-node=2", *LAUNCH, ALLREDUCE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "backend slurm, master gls-n0:" in r.stderr
    ok = [line for line in r.stdout.splitlines() if line.endswith("expected 10: OK")]
    assert len(ok) == 4, r.stdout
    assert sorted(line.split(" on ")[1].split()[0] for line in ok) == ["gls-n0", "gls-n0", "gls-n1", "gls-n1"]
    # The interface comes from the nodes themselves, probed through srun (no ssh on Slurm clusters).
    dry = launch(slurm_cluster, ["salloc", "-N2", "--ntasks-per-node=2", *LAUNCH, "--dry-run", "--json", ALLREDUCE])
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["backend"], plan["master_addr"], plan["ifname"]) == ("slurm", "gls-n0", "eth0")
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and plan["env"]["HCCL_SOCKET_IFNAME"] == "eth0"
    assert plan["commands"][0]["argv"][:6] == [
        "srun",
        f"--job-name=gaudi-launch-{plan['job_id']}",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--nodelist=gls-n0,gls-n1",
    ]


def test_allreduce_inside_sbatch(slurm_cluster, tmp_path):
    # The batch script runs on the allocation's first node, as on a real cluster.
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join([*LAUNCH, ALLREDUCE]) + "\n")
    out = tmp_path / "job.out"
    r = launch(
        slurm_cluster,
        ["sbatch", "--parsable", "-N2", "--ntasks-per-node=2", f"--chdir={REPO}", f"--output={out}", str(script)],
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]

    def state() -> str:  # polled: sbatch --wait checks only every few seconds, then less and less often
        shown = launch(slurm_cluster, ["scontrol", "-o", "show", "job", job]).stdout
        return " ".join(w for w in shown.split() if w.startswith(("JobState=", "ExitCode=")))

    wait_for(
        lambda: any(s in state() for s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")), timeout=180, interval=0.2
    )
    text = out.read_text() if out.exists() else ""
    assert state() == "JobState=COMPLETED ExitCode=0:0", text
    assert text.count("expected 10: OK") == 4, text


def test_allreduce_from_login_node(slurm_cluster):
    # srun allocates: the ranks take the step's first node as master and a port from the job id.
    r = launch(slurm_cluster, [*OUTSIDE, ALLREDUCE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("expected 10: OK") == 4, r.stdout


def test_layout_and_byte_exact_values(slurm_cluster, tmp_path):
    a = "it $(touch /tmp/gls-pwned) `id` \"dq\" 'sq' ; & |\nsecond line\ttab  "
    b = "ünïcode\\n=not-a-newline"
    env = slurm_cluster.env()
    env["VALUE_B"] = b  # exported by name (-x VALUE_B): the value stays off every argv
    logs = tmp_path / "logs"
    r = launch(
        slurm_cluster, [*OUTSIDE, "--log-dir", str(logs), "-x", f"VALUE_A={a}", "-x", "VALUE_B", RANK, "ok", a], env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert [layouts((logs / f"rank-{n}.log").read_text())[n]["host"] for n in range(4)] == [
        "gls-n0",
        "gls-n0",
        "gls-n1",
        "gls-n1",
    ]  # srun's --label sorts each line to its rank's log
    got = layouts(r.stdout)
    assert sorted(got) == [0, 1, 2, 3], r.stdout
    for rank, data in got.items():
        assert (data["VALUE_A"], data["VALUE_B"], data["argv"]) == (a, b, ["ok", a])
        assert data["WORLD_SIZE"] == "4" and data["LOCAL_WORLD_SIZE"] == "2"
        assert data["LOCAL_RANK"] == str(rank % 2) and data["NODE_RANK"] == str(rank // 2)
        assert data["host"] == f"gls-n{rank // 2}" and data["MASTER_ADDR"] == "gls-n0"
    assert len({d["MASTER_PORT"] for d in got.values()}) == 1
    assert not os.path.exists("/tmp/gls-pwned")


@pytest.mark.parametrize(
    "how,code,message",
    [
        ("fail:3:raise", 1, "RuntimeError: rank 3 crashed on purpose"),
        ("fail:2:7", 7, "exit code 7"),
    ],
)
def test_remote_rank_failure_names_rank_host_and_code(slurm_cluster, how, code, message):
    # srun --kill-on-bad-exit itself returns 143: the rank's own code comes from its record or srun's report.
    r = launch(slurm_cluster, [*OUTSIDE, RANK, how])
    rank = int(how.split(":")[1])
    assert r.returncode == code, r.stdout + r.stderr
    summary = r.stderr[r.stderr.index("gaudi-launch: job failed") :]
    assert f"first failure: rank {rank} on gls-n1" in summary and message in summary, summary
    if how.endswith("raise"):
        assert "in <module>\n  |     raise RuntimeError" in summary  # its traceback
    assert wait_for(lambda: no_job_processes(slurm_cluster), timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_process_on_any_node(slurm_cluster, sig):
    env = slurm_cluster.env()
    # Another Slurm job on the same nodes must survive.
    other = subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", "--job-name=other-job", "sleep", "300"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    launcher = subprocess.Popen(
        [*OUTSIDE, RANK, "wait"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        seen = []
        for line in launcher.stdout:
            seen += [line] if "waiting" in line else []
            if len(seen) == 4:
                break
        assert len(seen) == 4, launcher.stderr.read()
        launcher.send_signal(sig)
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + sig, err
        assert f"the launcher received {signal.Signals(sig).name}" in err

        def ours():  # per node, what runs besides Slurm's daemons and the other job's sleeps
            return [p for i in range(3) for p in slurm_cluster.job_processes(i) if not p.endswith(" sleep")]

        wait_for(lambda: not ours(), timeout=30)
        assert not ours(), ours()
        # The other job's tasks are still there, and it is still running.
        assert other.poll() is None
        assert sum(p.endswith(" sleep") for i in range(3) for p in slurm_cluster.job_processes(i)) == 2
    finally:
        for p in (launcher, other):
            if p.poll() is None:
                p.kill()
        subprocess.run(["scancel", "--name=other-job"], env=env, capture_output=True)
        other.wait(timeout=60)
    assert wait_for(lambda: no_job_processes(slurm_cluster), timeout=30)


def test_main_job_across_two_slurm_nodes(slurm_cluster, tmp_path):
    out = tmp_path / "clm"
    r = launch(
        slurm_cluster,
        [
            *LAUNCH,
            "--backend",
            "slurm",
            "--num_nodes",
            "2",
            "--num_devices",
            "1",
            os.path.join(REPO, "scripts", "run_clm.py"),
            "--do_train",
            "--do_eval",
            "--output_dir",
            str(out),
            "--max_steps",
            "4",
            "--logging_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--max_train_samples",
            "64",
            "--max_eval_samples",
            "16",
            "--distribution_strategy",
            "fast_ddp",
        ],
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (r.stdout + r.stderr).count("multi-node evaluation is not recommended") == 1  # rank 0, once
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["global_step"] == 4 and results["eval"]["perplexity"] > 0


@pytest.mark.parametrize("inside", [True, False], ids=["salloc", "login-node"])
def test_a_ranks_daemon_does_not_outlive_the_job(slurm_cluster, tmp_path, inside):
    # Slurm's linuxproc tracking loses a double-forked daemon: the job-id sweep (an srun --overlap
    # task per node) ends it on every node when the launcher is stopped. From a login node the
    # nodes and the job id are found once srun has them.
    pidfile = tmp_path / "launcher.pid"
    job = (
        [*LAUNCH, "--grace", "2", RANK, f"daemon:{tmp_path}"]
        if inside
        else [*LAUNCH, "--backend", "slurm", "--num_nodes", "2", "--grace", "2", RANK, f"daemon:{tmp_path}"]
    )
    wrap = ["salloc", "-N2", "--ntasks-per-node=1"] if inside else []
    launcher = subprocess.Popen(
        [*wrap, "sh", "-c", 'echo $$ > "$0" && exec "$@"', str(pidfile), *job],
        cwd=REPO,
        env=slurm_cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = 0
        for line in launcher.stdout:
            seen += "waiting" in line
            if seen == 2:
                break
        assert seen == 2, launcher.stderr.read()
        pids = [int((tmp_path / f"{rank}.pid").read_text()) for rank in (0, 1)]
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 143, err

        def running(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
            except OSError:
                return False

        assert wait_for(lambda: not any(running(p) for p in pids), timeout=30), pids
        assert wait_for(lambda: no_job_processes(slurm_cluster), timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_node_that_vanishes_ends_the_job_with_exit_4_naming_it(slurm_cluster):
    env = slurm_cluster.env()
    launcher = subprocess.Popen(
        ["salloc", "-N2", "--ntasks-per-node=1", *LAUNCH, "--grace", "2", RANK, "wait"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = 0
        for line in launcher.stdout:
            seen += "waiting" in line
            if seen == 2:
                break
        assert seen == 2, launcher.stderr.read()
        subprocess.run(["ip", "link", "set", slurm_cluster.veths[1], "down"], check=True)  # gls-n1's cable
        out, err = launcher.communicate(timeout=180)
        assert "host gls-n1 stopped answering" in err and "slurmd gone" in err, err
        assert "exit code: 4" in err, err
    finally:
        subprocess.run(["ip", "link", "set", slurm_cluster.veths[1], "up"], check=True)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    # Back on the network, the node ends what is left of the job (Slurm's own cleanup).
    assert wait_for(lambda: no_job_processes(slurm_cluster), timeout=90), [
        slurm_cluster.job_processes(i) for i in range(3)
    ]

    def all_idle() -> bool:  # for the next tests: a node Slurm marked down meanwhile is resumed
        states = launch(slurm_cluster, ["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()[1::2]
        if any(s.rstrip("*~#").startswith(("down", "drain", "fail")) for s in states):
            launch(slurm_cluster, ["scontrol", "update", "nodename=gls-n1", "state=resume"])
        return states == ["idle"] * 3

    assert wait_for(all_idle, timeout=90, interval=0.5)


def test_nodes_are_checked_through_srun_before_anything_starts(slurm_cluster):
    r = launch(slurm_cluster, ["salloc", "-N2", "--ntasks-per-node=1", *LAUNCH, "no_such_script.py"])
    assert r.returncode == 3, r.stderr
    assert "no_such_script.py does not exist on gls-n0, gls-n1" in r.stderr and "Traceback" not in r.stderr
    r = launch(
        slurm_cluster, ["salloc", "-N2", "--ntasks-per-node=1", *LAUNCH, "--python", "/nonexistent/python", RANK]
    )
    assert r.returncode == 3 and "/nonexistent/python" in r.stderr, r.stderr
    # Another job's listener on the master port of the master node.
    listen = "import socket, time; s = socket.socket(); s.bind(('', 24567)); s.listen(); print('up', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        ["nsenter", "-t", str(slurm_cluster.node_pid(0)), "-n", "--", sys.executable, "-c", listen],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "up"
        r = launch(slurm_cluster, ["salloc", "-N2", "--ntasks-per-node=1", *LAUNCH, "--master_port", "24567", RANK])
        assert r.returncode == 3 and "the master port 24567 is in use on gls-n0" in r.stderr, r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: no_job_processes(slurm_cluster), timeout=30)


def test_device_subset_inside_an_allocation(slurm_cluster):
    # --include picks slots as with a hostfile: slot 1 of each node is its second device.
    env = slurm_cluster.env()
    env["HABANA_VISIBLE_MODULES"] = "4,5,6,7"  # this shell's restriction: slot N is its Nth module
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = launch(
        slurm_cluster,
        ["salloc", "-N2", "--ntasks-per-node=2", *LAUNCH, "--include", "gls-n0:1@gls-n1:1", RANK, "ok"],
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = layouts(r.stdout)
    assert [
        (got[n]["host"], got[n]["LOCAL_RANK"], got[n]["HABANA_VISIBLE_MODULES"], got[n]["CUDA_VISIBLE_DEVICES"])
        for n in (0, 1)
    ] == [("gls-n0", "0", "5", "1"), ("gls-n1", "0", "5", "1")]


def test_sbatch_script_runs_the_job_with_its_values(slurm_cluster, tmp_path):
    a = "it $(touch /tmp/gls-pwned) `id` \"dq\" 'sq'\nsecond line"
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    r = launch(slurm_cluster, [*OUTSIDE, "--sbatch", str(script), "-x", f"VALUE_A={a}", RANK, "ok", "a b;$(x)"])
    assert r.returncode == 0 and script.exists(), r.stderr
    assert "gls-pwned" not in script.read_text()  # the value is in the private env file only
    r = launch(slurm_cluster, ["sbatch", "--parsable", f"--output={out}", str(script)])
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]

    def state() -> str:
        shown = launch(slurm_cluster, ["scontrol", "-o", "show", "job", job]).stdout
        return " ".join(w for w in shown.split() if w.startswith(("JobState=", "ExitCode=")))

    wait_for(lambda: any(s in state() for s in ("COMPLETED", "FAILED", "CANCELLED")), timeout=180, interval=0.2)
    text = out.read_text() if out.exists() else ""
    assert state() == "JobState=COMPLETED ExitCode=0:0", text
    got = layouts(text)
    assert sorted(got) == [0, 1, 2, 3], text
    assert all((d["VALUE_A"], d["argv"]) == (a, ["ok", "a b;$(x)"]) for d in got.values())
    assert {d["host"] for d in got.values()} == {"gls-n0", "gls-n1"}
    assert not os.path.exists("/tmp/gls-pwned")


def test_ctrl_c_while_srun_waits_for_nodes_cancels_the_request(slurm_cluster):
    env = slurm_cluster.env()
    nodes = "gls-n[0-2]"
    launcher = None
    # Drained nodes: a new job waits for them (pending), as on a busy cluster.
    launch(slurm_cluster, ["scontrol", "update", f"nodename={nodes}", "state=drain", "reason=gaudi-launch-test"])
    try:
        launcher = subprocess.Popen(
            [*OUTSIDE, RANK, "ok"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

        def pending() -> bool:
            return " PD" in launch(slurm_cluster, ["squeue", "-h", "-o", "%j %t"]).stdout

        assert wait_for(pending, timeout=30)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, err
        assert "LAYOUT" not in out  # nothing ran
        assert wait_for(
            lambda: "gaudi-launch-" not in launch(slurm_cluster, ["squeue", "-h", "-o", "%j"]).stdout, timeout=30
        )  # the request is withdrawn, not left to run later
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launch(slurm_cluster, ["scontrol", "update", f"nodename={nodes}", "state=resume"])
    assert wait_for(lambda: launch(slurm_cluster, ["sinfo", "-h", "-o", "%t"]).stdout.split() == ["idle"], timeout=30)


def test_sbatch_reads_each_option_value_whole(slurm_cluster, tmp_path):
    # Written unquoted, '#SBATCH --comment=x --hold' made sbatch hold the job: a value is one option's value.
    script = tmp_path / "job.sh"
    r = launch(slurm_cluster, [*OUTSIDE, "--sbatch", str(script), "--slurm-args", "--comment='x --hold'", RANK, "ok"])
    assert r.returncode == 0 and script.exists(), r.stderr
    r = launch(slurm_cluster, ["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", str(script)])
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    try:
        shown = launch(slurm_cluster, ["scontrol", "-o", "show", "job", job]).stdout
        assert "Comment=x --hold " in shown and "JobHeldUser" not in shown and "Priority=0 " not in shown, shown
    finally:
        launch(slurm_cluster, ["scancel", job])
