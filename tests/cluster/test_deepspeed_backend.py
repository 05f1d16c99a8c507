"""The deepspeed backend on real hosts (issue 10 items 1, 3, 4, 10), through DeepSpeed's runner and
real pdsh on a namespace cluster of this module's own (hosts glds-n0..2, so it runs beside the
session's cluster). The launcher runs "on" glds-n0, like a user on the first node."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests.cluster.conftest import require_cluster_support, running
from tests.cluster.netcluster import NetCluster
from tests.helpers import all_gone, read_pids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = os.path.join(ROOT, "tests", "integration", "rank_behaviour.py")
PROBE = (
    "import json, os, socket, sys\n"
    "print('SEEN ' + json.dumps({'host': socket.gethostname(), 'rank': os.environ['RANK'],"
    " 'local': os.environ['LOCAL_RANK'], 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
    " 'argv': sys.argv[1:]}), flush=True)\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_cluster_support()
    c = NetCluster(3, str(tmp_path_factory.mktemp("dscluster")), prefix="glds", subnet_octet=219)
    with running(c):
        yield c


def launch(cluster, hostfile, *args, cwd):
    argv = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--hostfile",
        hostfile,
        "--ssh-config",
        cluster.ssh_config,
        "--use_deepspeed",
        "--grace",
        "5",
        *args,
    ]
    return cluster.run_on(0, argv, env=cluster.env(), cwd=str(cwd), capture_output=True, text=True, timeout=300)


def seen(stdout: str) -> list:
    return sorted(
        (json.loads(line[line.find("SEEN ") + 5 :]) for line in stdout.splitlines() if "SEEN {" in line),
        key=lambda r: int(r["rank"]),
    )


@pytest.mark.parametrize(
    "hosts, args, devices",
    [
        ((0, 1), ["--include", "glds-n1:0,2"], "0,2"),
        ((1, 2), ["--num_nodes", "1"], "0,1"),
        ((1,), [], "0,1"),
    ],
    ids=["include", "num_nodes", "one-line-hostfile"],
)
def test_one_selected_remote_host_runs_the_ranks_there(cluster, tmp_path, hosts, args, devices):
    (tmp_path / "probe.py").write_text(PROBE)
    hostfile = cluster.hostfile(slots=3, hosts=list(hosts))
    if hosts != (0, 1):
        args = [*args, "--num_devices", "2"]
    res = launch(cluster, hostfile, *args, "probe.py", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ranks = seen(res.stdout)
    assert [(r["host"], r["rank"], r["local"]) for r in ranks] == [("glds-n1", "0", "0"), ("glds-n1", "1", "1")]
    assert {r["cuda"] for r in ranks} == {devices}


@pytest.mark.parametrize(
    "selector", [["--include", "glds-n1:1,3@glds-n2"], ["--exclude", "glds-n1:0,2"]], ids=["include", "exclude"]
)
def test_user_at_host_entries_with_a_selector(cluster, tmp_path, selector):
    (tmp_path / "probe.py").write_text(PROBE)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("root@glds-n1 slots=4\nroot@glds-n2 slots=2\n")
    res = launch(cluster, str(hostfile), *selector, "probe.py", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [(r["host"], r["rank"], r["local"], r["cuda"]) for r in seen(res.stdout)] == [
        ("glds-n1", "0", "0", "1,3"),
        ("glds-n1", "1", "1", "1,3"),
        ("glds-n2", "2", "0", "0,1"),
        ("glds-n2", "3", "1", "0,1"),
    ]


def test_append_local_rank_on_every_host(cluster, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    res = launch(
        cluster, cluster.hostfile(slots=2, hosts=[0, 1]), "--append-local-rank", "probe.py", "a b", "-x", cwd=tmp_path
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [(r["host"], r["argv"]) for r in seen(res.stdout)] == [
        ("glds-n0", ["--local_rank=0", "a b", "-x"]),
        ("glds-n0", ["--local_rank=1", "a b", "-x"]),
        ("glds-n1", ["--local_rank=0", "a b", "-x"]),
        ("glds-n1", ["--local_rank=1", "a b", "-x"]),
    ]


def test_uneven_nodes_give_each_rank_its_place_on_the_node(cluster, tmp_path):
    # DeepSpeed's launch.py gives RANK % (ranks on the node): 1 and 0 for ranks 1 and 2 on glds-n1.
    (tmp_path / "probe.py").write_text(PROBE)
    res = launch(
        cluster,
        cluster.hostfile(slots=2, hosts=[0, 1]),
        "--include",
        "glds-n0:1@glds-n1",
        "--append-local-rank",
        "probe.py",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [(r["host"], r["rank"], r["local"], r["argv"], r["cuda"]) for r in seen(res.stdout)] == [
        ("glds-n0", "0", "0", ["--local_rank=0"], "1"),
        ("glds-n1", "1", "0", ["--local_rank=0"], "0,1"),
        ("glds-n1", "2", "1", ["--local_rank=1"], "0,1"),
    ]


@pytest.mark.parametrize(
    "hosts, slots, fail, how, code, status",
    [
        ((0, 1), 2, 3, "exit:1", 1, "exit code 1"),
        ((0, 1), 2, 3, "kill9", 137, "killed by SIGKILL"),
        ((1,), 1, 0, "exit:1", 1, "exit code 1"),
    ],
    ids=["exit", "kill9", "one-remote-rank"],
)
def test_a_failing_remote_rank_is_named_with_its_code_prefix_and_log(
    cluster, tmp_path, hosts, slots, fail, how, code, status
):
    pids, logs = tmp_path / "pids", tmp_path / "logs"
    pids.mkdir()
    res = launch(
        cluster,
        cluster.hostfile(slots=slots, hosts=list(hosts)),
        "--log-dir",
        str(logs),
        RANK,
        "--pid-dir",
        str(pids),
        "--fail-rank",
        str(fail),
        "--how",
        how,
        cwd=tmp_path,
    )
    assert res.returncode == code, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(rf"first failure: rank {fail} on glds-n1 \(.*\), {status} after", res.stderr), res.stderr[-3000:]
    assert f"[rank {fail}] rank {fail} about to fail ({how})" in res.stdout
    world = slots * len(hosts)
    for rank in range(world):
        assert f"[rank {rank}] rank {rank} started" in res.stdout
        assert f"rank {rank} started" in (logs / f"rank-{rank}.log").read_text().splitlines()
    assert all_gone(read_pids(str(pids)), timeout=30)


def test_a_relative_ssh_config_reaches_the_hosts_from_the_runners_job_directory(cluster, tmp_path):
    # Issue 27 item 12: DeepSpeed's runner (and so pdsh's ssh) runs in the job directory, where a
    # relative -F path names nothing; ssh failed there and the failure was blamed on rank 0.
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ssh_config").write_text(open(cluster.ssh_config).read())
    argv = [sys.executable, "-m", "gaudi_launch", "--hostfile", cluster.hostfile(slots=1, hosts=[0, 1])]
    argv += ["--ssh-config", "conf/ssh_config", "--use_deepspeed", "--grace", "5", "probe.py"]
    res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [(r["host"], r["rank"]) for r in seen(res.stdout)] == [("glds-n0", "0"), ("glds-n1", "1")]


def test_a_failed_shipping_takes_the_job_file_off_the_hosts_that_got_it(cluster, tmp_path):
    # Issue 27 item 8: nothing starts when one host cannot get the job file; the hosts that did get it
    # (its values in clear, 0600) lose it at once. (The cluster's hosts share this filesystem: the
    # directory that glds-n1 received is the one seen here.)
    import secrets

    from gaudi_launch.backends import deepspeed
    from gaudi_launch.errors import UserError
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
    from gaudi_launch.remote import jobdir

    directory = jobdir.path_for(secrets.token_hex(4))
    nodes = [NodePlan("glds-n1", 0, [0], [0]), NodePlan("nobody@glds-n2", 1, [0], [1])]  # nobody: refused
    plan = LaunchPlan("deepspeed", 2, "glds-n1", 29500, nodes, {}, [], ["t.py"], ssh_args=["-F", cluster.ssh_config])
    job = jobdir.payload({"MY_TOKEN": "tok-in-clear"}, ["t.py"], False, str(tmp_path), "k")
    try:
        with pytest.raises(UserError, match="could not put the job file on nobody@glds-n2"):
            deepspeed.ship_job(plan, JobSpec(program=["t.py"]), directory, job)
        assert not os.path.exists(directory)
    finally:
        jobdir.remove([directory])
