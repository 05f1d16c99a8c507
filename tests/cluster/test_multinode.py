"""Multi-node jobs on the namespace cluster, for both multi-host backends: real sshd, real OpenMPI,
real DeepSpeed (pdsh). The launcher runs "on" host gl-n0 like a user on the first node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import alive, all_gone, read_pids, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(ROOT, "scripts", "allreduce_smoke.py")
RANK = os.path.join(ROOT, "tests", "integration", "rank_behaviour.py")
BACKENDS = ["mpirun", "deepspeed"]


def launch_argv(cluster, backend, hostfile, *args, extra=()):
    return [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        hostfile,
        "--ssh-config",
        cluster.ssh_config,
        "--backend",
        backend,
        "--grace",
        "5",
        *extra,
        *args,
    ]


def run_job(cluster, backend, *args, hosts=(0, 1), slots=2, cwd=None, extra=(), timeout=240):
    hostfile = cluster.hostfile(slots=slots, hosts=list(hosts))
    return cluster.run_on(
        0,
        launch_argv(cluster, backend, hostfile, *args, extra=extra),
        env=cluster.env(),
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_job(cluster, backend, *args, hosts=(0, 1), slots=2, cwd=None):
    hostfile = cluster.hostfile(slots=slots, hosts=list(hosts))
    return cluster.popen_on(
        0,
        launch_argv(cluster, backend, hostfile, *args),
        env=cluster.env(),
        cwd=cwd or ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rank_lines(stdout: str) -> list:
    out = []
    for line in stdout.splitlines():
        start = line.find("{")
        if start >= 0 and '"rank"' in line:
            out.append(json.loads(line[start:]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_gloo_allreduce_two_hosts_two_ranks(cluster, backend):
    res = run_job(cluster, backend, SMOKE)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [line for line in res.stdout.splitlines() if "all_reduce sum = 10, expected 10: OK" in line]
    assert len(ok) == 4
    assert sum(" on gl-n0 " in line for line in ok) == 2
    assert sum(" on gl-n1 " in line for line in ok) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_from_a_login_node_outside_the_hostfile(cluster, backend):
    # The root namespace has the machine's own interfaces besides the cluster bridge: the job must
    # still rendezvous on the hosts' network, with no rank on the login node.
    hostfile = cluster.hostfile(slots=2, hosts=[0, 1])
    argv = cluster.login_argv(launch_argv(cluster, backend, hostfile, SMOKE))
    res = subprocess.run(argv, env=cluster.env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [line for line in res.stdout.splitlines() if "all_reduce sum = 10, expected 10: OK" in line]
    assert sum(" on gl-n0 " in line for line in ok) == 2 and sum(" on gl-n1 " in line for line in ok) == 2
    assert len(ok) == 4
    dry = subprocess.run(
        cluster.login_argv(launch_argv(cluster, backend, hostfile, "--dry-run", "--json", SMOKE)),
        env=cluster.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    plan = json.loads(dry.stdout)
    assert (plan["master_addr"], plan["ifname"]) == ("gl-n0", "eth0")
    if backend == "mpirun":
        assert plan["tcp_cidr"] == "10.213.0.0/24"


def test_main_job_across_two_hosts_advises_evaluating_on_one_node(cluster, tmp_path):
    out = tmp_path / "clm"
    res = run_job(
        cluster,
        "mpirun",
        os.path.join(ROOT, "scripts", "run_clm.py"),
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
        slots=1,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = res.stdout + res.stderr
    assert text.count("multi-node evaluation is not recommended") == 1  # rank 0, once
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["global_step"] == 4 and results["eval"]["perplexity"] > 0
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()  # for the one-node eval


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_and_args_arrive_byte_exact_on_remote_ranks(cluster, backend, tmp_path):
    tricky = 'a  b $(id) `id` "dq" \'sq\' ; {"j": [1, 2]} \\ end '
    escaped = tricky.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    (tmp_path / ".deepspeed_env").write_text(f'TRICKY="{escaped}"\n')
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, socket, sys\n"
        "print(json.dumps({'rank': os.environ['RANK'], 'host': socket.gethostname(),"
        " 'v': os.environ.get('TRICKY'), 'argv': sys.argv[1:]}))\n"
    )
    args = ["x  y", "$(id)", ";", '{"k": "v"}', "--flag=a b"]
    res = run_job(cluster, backend, str(probe), *args, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = rank_lines(res.stdout)
    assert sorted(int(r["rank"]) for r in seen) == [0, 1, 2, 3]
    assert {r["host"] for r in seen} == {"gl-n0", "gl-n1"}
    for r in seen:
        assert r["v"] == tricky
        assert r["argv"] == args


def test_distributed_runner_with_deepspeed_across_hosts(cluster, tmp_path):
    code = (
        "import sys\n"
        "from gaudi_launch import DistributedRunner\n"
        f"r = DistributedRunner([{SMOKE!r}], hostfile={cluster.hostfile(slots=2, hosts=[0, 1])!r},\n"
        f"    use_deepspeed=True, master_port=None, ssh_config={cluster.ssh_config!r})\n"
        "code = r.run()\n"
        "print('EXIT', code, sorted(r.result.exit_codes.items()))\n"
        "sys.exit(code)\n"
    )
    res = cluster.run_on(
        0,
        [sys.executable, "-c", code],
        env=cluster.env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [line for line in res.stdout.splitlines() if "expected 10: OK" in line]
    assert len(ok) == 4 and any("gl-n1" in line for line in ok)


@pytest.mark.parametrize("backend", BACKENDS)
def test_remote_rank_crash_tears_down_every_host(cluster, backend, tmp_path):
    res = run_job(cluster, backend, RANK, "--pid-dir", str(tmp_path), "--fail-rank", "3", "--how", "raise")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]
    err = res.stderr
    assert "first failure: rank 3 on gl-n1" in err
    assert "ValueError: boom from rank 3" in err
    pids = read_pids(tmp_path)
    assert len(pids) == 8
    assert all_gone(pids, timeout=20), [p for p in pids if alive(p)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_leaves_nothing_on_any_host(cluster, backend, sig, tmp_path):
    job = start_job(cluster, backend, RANK, "--pid-dir", str(tmp_path))
    try:
        assert wait_for(lambda: len(read_pids(tmp_path)) == 8, timeout=120), job.stderr
        pids = read_pids(tmp_path)
        job.send_signal(sig)
        _, err = job.communicate(timeout=60)
        assert job.returncode == 128 + sig, err[-3000:]
        assert f"the launcher received {signal.Signals(sig).name}" in err
        assert all_gone(pids, timeout=20), [p for p in pids if alive(p)]
    finally:
        job.kill()


@pytest.mark.parametrize("backend", BACKENDS)
def test_teardown_leaves_a_second_job_on_the_same_hosts_alone(cluster, backend, tmp_path):
    other_dir, failing_dir = tmp_path / "other", tmp_path / "failing"
    other_dir.mkdir()
    failing_dir.mkdir()
    other = start_job(cluster, backend, RANK, "--pid-dir", str(other_dir))
    try:
        assert wait_for(lambda: len(read_pids(other_dir)) == 8, timeout=120)
        res = run_job(cluster, backend, RANK, "--pid-dir", str(failing_dir), "--fail-rank", "2", "--how", "exit:5")
        assert res.returncode != 0
        assert all_gone(read_pids(failing_dir), timeout=20)
        survivors = read_pids(other_dir)
        assert all(alive(p) for p in survivors), "the first job's teardown touched the second job"
        assert other.poll() is None
    finally:
        other.send_signal(signal.SIGTERM)
        other.communicate(timeout=60)
    assert all_gone(read_pids(other_dir), timeout=20)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_host_ends_the_job_naming_it(cluster, backend, tmp_path):
    job = start_job(cluster, backend, RANK, "--pid-dir", str(tmp_path), hosts=(0, 2))
    try:
        assert wait_for(lambda: len(read_pids(tmp_path)) == 8, timeout=120)
        cluster.cut_link(2)
        lost_at = time.monotonic()
        _, err = job.communicate(timeout=90)
        took = time.monotonic() - lost_at
        assert job.returncode == 4, err[-3000:]
        assert "host gl-n2 stopped answering" in err
        assert took < 30, f"took {took:.0f} s to notice"  # the bound, not a speed benchmark
    finally:
        cluster.restore_link(2)
        job.kill()
    # The cut host's ranks lost their peers; nothing of the job may stay anywhere.
    assert all_gone(read_pids(tmp_path), timeout=60), [p for p in read_pids(tmp_path) if alive(p)]


@pytest.mark.parametrize("case", ["missing-script", "sshd-down"])
def test_preflight_failure_spawns_nothing(cluster, case, tmp_path):
    script = str(tmp_path / "nowhere.py") if case == "missing-script" else SMOKE
    if case == "sshd-down":
        cluster.stop_sshd(1)
    try:
        res = run_job(cluster, "mpirun", script, extra=["--ssh-timeout", "3"])
    finally:
        if case == "sshd-down":
            cluster.start_sshd(1)
    assert res.returncode == 3, res.stderr
    assert "pre-flight failed: nothing was started" in res.stderr
    assert "gl-n1" in res.stderr
    assert "gaudi-launch: job" not in res.stderr  # never reached the spawn


def test_dry_run_json_shows_interface_and_exports(cluster, tmp_path):
    res = run_job(cluster, "mpirun", SMOKE, extra=["--dry-run", "--json", "-x", "HF_TOKEN=hf_abcdefgh"])
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["ifname"] == "eth0"
    assert plan["tcp_cidr"] == "10.213.0.0/24"
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and plan["env"]["HF_TOKEN"] == "***"
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("btl_tcp_if_include") + 1] == "10.213.0.0/24"
    assert "hf_abcdefgh" not in res.stdout


def test_a_multi_host_plan_replays_from_its_json(cluster, tmp_path):
    hostfile = cluster.hostfile(slots=2, hosts=[0, 1])
    res = cluster.run_on(
        0,
        launch_argv(cluster, "mpirun", hostfile, "--dry-run", "--json", SMOKE),
        env=cluster.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(res.stdout)
    res = cluster.run_on(
        0,
        [sys.executable, "-m", "gaudi_launch", "run", str(plan)],
        env=cluster.env(),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [line for line in res.stdout.splitlines() if "all_reduce sum = 10, expected 10: OK" in line]
    assert sum(" on gl-n0 " in line for line in ok) == 2 and sum(" on gl-n1 " in line for line in ok) == 2


def test_mpirun_runs_an_uneven_selection_each_rank_on_its_node(cluster, tmp_path):
    # The README's `--include 'worker-0:0,1@worker-1'` shape on the default backend: host 0 runs device 1
    # only, host 1 both; each rank knows its node, its place on it and its device, and gloo connects all 3.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, socket, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "import torch; t = torch.ones(1); dist.all_reduce(t)\n"
        "print(json.dumps({'rank': os.environ['RANK'], 'host': socket.gethostname(), 'node': os.environ['NODE_RANK'],"
        " 'local': os.environ['LOCAL_RANK'], 'size': os.environ['LOCAL_WORLD_SIZE'],"
        " 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), 'sum': t.item()}))\n"
        "dist.destroy_process_group()\n"
    )
    res = run_job(cluster, "mpirun", "--include", "gl-n0:1@gl-n1", str(probe), cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = sorted(rank_lines(res.stdout), key=lambda r: int(r["rank"]))
    assert [(r["rank"], r["host"], r["node"], r["local"], r["size"], r["cuda"], r["sum"]) for r in seen] == [
        ("0", "gl-n0", "0", "0", "1", "1", 3.0),
        ("1", "gl-n1", "1", "0", "2", "0,1", 3.0),
        ("2", "gl-n1", "1", "1", "2", "0,1", 3.0),
    ]
