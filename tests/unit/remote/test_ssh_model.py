"""One SSH model: every place the launcher reaches a host reads the same ssh settings (inputs/sshconfig.py)
and names the same user (the hostfile's user@host first): the pre-flight's own client, the ssh options of
every backend, the host watch and --wait-hosts, and mpirun's hosts."""

from __future__ import annotations

import socket

from gaudi_launch.backends import mpirun
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.inputs.sshconfig import SshConfig
from gaudi_launch.plan import multinode
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.remote.sshclient import SshOptions, target_of
from gaudi_launch.remote.watch import HostWatch, ssh_endpoints
from gaudi_launch.reports import environment


def included(tmp_path, main: str, part: str) -> str:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "n.conf").write_text(part)
    path = tmp_path / "config"
    path.write_text(main.format(inc=tmp_path / "conf.d"))
    return str(path)


def test_watch_and_wait_hosts_probe_the_included_hostname_and_port(tmp_path):
    """paramiko's SSHConfig (used here before) does not follow Include: the watch probed n1:22."""
    cfg = included(tmp_path, "Include {inc}/*.conf\n", "Host n1\n  HostName 10.9.9.1\n  Port 2222\n")
    assert ssh_endpoints(["root@n1", "n2"], None, cfg) == [("root@n1", "10.9.9.1", 2222), ("n2", "n2", 22)]
    assert ssh_endpoints(["n1"], 2300, cfg) == [("n1", "10.9.9.1", 2300)]  # --ssh-port wins
    with socket.socket() as sshd:  # where the config says n1's sshd is (the name n1 itself resolves nowhere)
        sshd.bind(("127.0.0.1", 0))
        sshd.listen()
        (tmp_path / "conf.d" / "n.conf").write_text(f"Host n1\n  HostName 127.0.0.1\n  Port {sshd.getsockname()[1]}\n")
        watch = HostWatch(lambda: ssh_endpoints(["n1"], None, cfg), timeout=1.0, misses=1)
        assert watch.probe() is None and watch.missed == {"n1": 0}


def test_preflight_client_takes_user_port_keys_and_host_key_policy_from_the_reader(tmp_path):
    key = tmp_path / "k"
    key.write_text("x")
    cfg = included(
        tmp_path,
        "Host *\n  Include {inc}/*.conf\n",
        f"Host n1\n  User nobody\n  Port 2201\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {tmp_path}/kh\n  StrictHostKeyChecking yes\n",
    )
    opts = SshOptions(config=cfg)
    t = target_of("root@n1", opts, SshConfig(cfg).lookup("root@n1"))
    assert (t.user, t.port, t.key_files, t.allow_agent) == ("root", 2201, [str(key)], False)
    assert (t.known_hosts, t.strict) == (f"{tmp_path}/kh", True)
    t = target_of("n1", opts, SshConfig(cfg).lookup("n1"))
    assert t.user == "nobody"


def test_ssh_args_leave_host_keys_to_an_included_policy_and_to_what_only_ssh_can_tell(tmp_path):
    spec = JobSpec(program=["t.py"], ssh_config=included(tmp_path, "Include {inc}/*.conf\n", "Host n*\n  Port 1\n"))
    assert "StrictHostKeyChecking=accept-new" in multinode.ssh_args(
        spec, multinode.configured_host_keys(["n1"], spec.ssh_config)
    )
    (tmp_path / "conf.d" / "n.conf").write_text("Host n1\n  StrictHostKeyChecking yes\n")
    assert multinode.configured_host_keys(["n0", "n1"], spec.ssh_config) == "yes"
    (tmp_path / "conf.d" / "n.conf").write_text('Match exec "test -e /x"\n  StrictHostKeyChecking no\n')
    policy = multinode.configured_host_keys(["n1"], spec.ssh_config)
    assert policy == "unknown" and not any("StrictHostKeyChecking" in a for a in multinode.ssh_args(spec, policy))


def plan_of(*hosts: str) -> LaunchPlan:
    nodes = [NodePlan(h, i, [0, 1], [2 * i, 2 * i + 1]) for i, h in enumerate(hosts)]
    return LaunchPlan(
        backend="mpirun",
        world_size=2 * len(hosts),
        master_addr="n0",
        master_port=29600,
        nodes=nodes,
        env={},
        commands=[],
        program=["t.py"],
        job_id="feedbeef",
    )


def test_mpirun_gets_each_hosts_user_through_its_hostfile():
    """OpenMPI's --host keeps 'root@n1' as the node's name (OpenMPI 4's daemons then refuse it), so the
    user was stripped and mpirun's daemons logged in as ssh_config's User: the hostfile carries it now."""
    spec = JobSpec(program=["t.py"], python="/py")
    plain = plan_of("n0", "n1")
    assert mpirun.hostfile_path(plain) is None
    argv = mpirun.build_argv(plain, spec, version=4, root=True, exported=[])
    assert argv[argv.index("--host") + 1] == "n0:2,n1:2"
    users = plan_of("n0", "deploy@n1")
    path = mpirun.hostfile_path(users)
    assert path is not None and path.endswith("/mpirun-hosts")
    argv = mpirun.build_argv(users, spec, version=5, root=True, exported=[], hostfile=path)
    assert "--host" not in argv and argv[argv.index("--hostfile") + 1] == path
    assert mpirun.hostfile_text(users) == "n0 slots=2\ndeploy@n1 slots=2\n"


def test_env_report_gives_its_ssh_the_jobs_host_key_rule(tmp_path, monkeypatch):
    """`gaudi-launch env --hostfile` added StrictHostKeyChecking=accept-new even where the ssh config
    says yes (its ssh_args call skipped the config's policy); it now builds them as a job does."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\n")
    cfg = included(tmp_path, "Include {inc}/*.conf\n", "Host n1\n  StrictHostKeyChecking yes\n")
    seen = {}
    monkeypatch.setattr(environment, "collect_hosts", lambda h, options, py: seen.setdefault("o", options) and ({}, {}))
    environment.report(hostfile=str(hostfile), ssh_config=cfg)
    assert "-F" in seen["o"] and not any("StrictHostKeyChecking" in o for o in seen["o"])
