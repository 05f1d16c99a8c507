"""The SSH pre-flight against real hosts: network namespaces with real sshds (tests/cluster/netcluster.py).

Most checks call check_hosts in-process from the root namespace, which reaches the hosts over the
bridge (10.213.0.1). The name-resolution check and the "login node is a cluster host" checks run
inside host 0, whose resolv.conf points at 127.0.0.1, so no DNS query ever leaves the machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gaudi_launch.plan.fabric import parse_ip_addr
from gaudi_launch.remote.preflight import CheckReport, SshOptions, check_hosts
from tests.standin import gaudi_tools

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "tests/cluster/netcluster.py"  # exists on every host (they share this filesystem)


@pytest.fixture(autouse=True)
def no_agent(monkeypatch):
    # An ssh-agent of whoever runs the tests must not log us in with some other key.
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def opts(cluster, tmp_path, **kw) -> SshOptions:
    base = dict(identity=cluster.key, config=cluster.ssh_config, known_hosts=str(tmp_path / "known_hosts"))
    base.update(kw)
    return SshOptions(**base)


def check(
    cluster,
    ssh: SshOptions,
    hosts=None,
    script=SCRIPT,
    python=sys.executable,
    master_port=29577,
    devices_needed=None,
    progress=None,
) -> CheckReport:
    hosts = cluster.names if hosts is None else hosts
    return check_hosts(
        hosts,
        python=python,
        script=script,
        cwd=REPO,
        master_host=hosts[0],
        master_addr=cluster.hosts[0].addr,
        master_port=master_port,
        devices_needed=devices_needed or {},
        ssh=ssh,
        local=lambda h: False,
        progress=progress,
    )


_IN_HOST = textwrap.dedent("""
    import dataclasses, json, sys
    from gaudi_launch.inputs.hostnames import is_local_host
    from gaudi_launch.remote.preflight import SshOptions, check_hosts
    kw = json.loads(sys.argv[1])
    kw["ssh"] = SshOptions(**kw["ssh"])
    report = check_hosts(local=is_local_host, **kw)
    print(json.dumps({"facts": {h: dataclasses.asdict(f) for h, f in report.facts.items()},
                      "warnings": report.warnings, "table": report.render_table(), "ok": report.ok}))
""")


def check_in_host0(cluster, env=None, timeout=60, **kw) -> dict:
    """check_hosts run inside host 0 (its network, hostname and resolver); `local` = is_local_host."""
    kw.setdefault("python", sys.executable)
    kw.setdefault("script", SCRIPT)
    kw.setdefault("cwd", REPO)
    kw.setdefault("master_host", cluster.names[0])
    kw.setdefault("master_addr", cluster.hosts[0].addr)
    kw.setdefault("master_port", 29577)
    kw.setdefault("devices_needed", {})
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = REPO
    env.pop("SSH_AUTH_SOCK", None)
    r = cluster.run_on(
        0,
        [sys.executable, "-c", _IN_HOST, json.dumps(kw)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_all_hosts_ok(cluster, tmp_path):
    seen = []
    ssh = opts(cluster, tmp_path)
    report = check(cluster, ssh, progress=lambda host, status: seen.append((host, status)))
    assert report.ok, report.render_table()
    assert sorted(seen) == [(h, "OK") for h in cluster.names]
    assert list(report.facts) == cluster.names
    for h in cluster.hosts:
        f = report.facts[h.name]
        assert f.hostname == h.name
        assert f.ncpus and f.ncpus > 0
        assert f"inet {h.addr}/24" in f.ip_addr
        assert [i.addresses for i in parse_ip_addr(f.ip_addr) if i.name == "eth0"][0][0] == f"{h.addr}/24"
        assert f.python_ok is True and f.script_ok is True and f.master_reachable is True
        assert f.devices is None  # no hl-smi here
        assert f.port_free is (True if h.index == 0 else None)
    assert report.warnings == [f"device count not checked (no hl-smi) on {', '.join(cluster.names)}"]
    assert "\n".join(report.render_table().splitlines()[1:4]).count(" OK ") == 3
    # accept-new wrote the (right) keys: a strict second run accepts them
    with open(ssh.known_hosts) as f:
        assert len(f.read().splitlines()) == 3
    again = check(cluster, dataclasses.replace(ssh, strict=True))
    assert again.ok, again.render_table()


def test_key_user_and_known_hosts_from_the_ssh_config(cluster, tmp_path):
    """No --ssh-identity, no known_hosts: IdentityFile, User and UserKnownHostsFile come from the config
    (the cluster's known_hosts holds the real host keys, so even strict checking passes)."""
    report = check(cluster, SshOptions(config=cluster.ssh_config, strict=True))
    assert report.ok, report.render_table()


def test_wrong_key_is_refused_fast_and_named(cluster, tmp_path):
    wrong = str(tmp_path / "wrong key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", wrong], check=True)
    t0 = time.monotonic()
    report = check(cluster, opts(cluster, tmp_path, identity=wrong, timeout=10.0))
    took = time.monotonic() - t0
    assert not report.ok
    for h in cluster.hosts:
        f = report.facts[h.name]
        assert f.reason.startswith("auth refused") and f"tried key {wrong}" in f.reason, f.reason
        assert "ssh-copy-id -i" in f.fix and f"root@{h.addr}" in f.fix and "authorized_keys" in f.fix
        assert f.python_ok is None and f.hostname is None
    assert took < 5, took  # well under the 10 s timeout: a refusal is not a timeout


def test_sshd_down_on_one_host(cluster, tmp_path):
    try:
        cluster.stop_sshd(1)
        report = check(cluster, opts(cluster, tmp_path, timeout=5.0))
    finally:
        cluster.start_sshd(1)
    assert [f.host for f in report.failures()] == [cluster.names[1]]
    f = report.facts[cluster.names[1]]
    assert f.reason.startswith(f"connection refused by {cluster.hosts[1].addr}:22"), f.reason
    assert "sshd" in f.fix and "--ssh-port" in f.fix
    assert report.facts[cluster.names[0]].ok and report.facts[cluster.names[2]].ok


def test_unreachable_address_times_out(cluster, tmp_path):
    addr = f"10.{cluster.octet}.0.99"  # on the cluster's subnet, nobody there: ARP never answers
    # A recent failed ARP lookup would answer "no route to host" at once: start from a clean slate.
    subprocess.run(["ip", "neigh", "flush", "to", addr, "dev", cluster.bridge], check=False)
    t0 = time.monotonic()
    report = check(cluster, opts(cluster, tmp_path, timeout=2.0), hosts=[addr])
    took = time.monotonic() - t0
    f = report.facts[addr]
    assert not f.ok
    assert f.reason == f"timed out after 2 s connecting to {addr}:22", f.reason
    assert "security group" in f.fix and "--ssh-timeout" in f.fix
    assert took < 10, took


def test_name_that_does_not_resolve(cluster, tmp_path):
    name = "gl-nowhere.invalid"
    got = check_in_host0(
        cluster, hosts=[name], master_host=name, ssh=dataclasses.asdict(opts(cluster, tmp_path, timeout=5.0))
    )
    f = got["facts"][name]
    assert not f["ok"]
    assert f["reason"].startswith(f"name does not resolve: {name}"), f["reason"]
    assert "hostfile" in f["fix"] and "/etc/hosts" in f["fix"]


def test_missing_script(cluster, tmp_path):
    missing = "no/such dir/train.py"
    report = check(cluster, opts(cluster, tmp_path), script=missing)
    assert len(report.failures()) == 3
    for f in report.failures():
        assert f"script {missing} not found on {f.host} (cwd {REPO})" in f.reason, f.reason
        assert f.script_ok is False and f.python_ok is True


def test_missing_python(cluster, tmp_path):
    report = check(cluster, opts(cluster, tmp_path), python="/opt/no python/bin/python3")
    for f in report.failures():
        assert "python /opt/no python/bin/python3 not found or not executable" in f.reason, f.reason
        assert f.python_ok is False and "--python" in f.fix
    assert len(report.failures()) == 3


def test_changed_host_key(cluster, tmp_path):
    other = str(tmp_path / "other_host_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    with open(other + ".pub") as f:
        kt, kb = f.read().split()[:2]
    known = tmp_path / "known_hosts"
    wrong_line = f"{cluster.names[1]},{cluster.hosts[1].addr} {kt} {kb}\n"
    known.write_text(wrong_line)
    report = check(cluster, opts(cluster, tmp_path))
    assert [f.host for f in report.failures()] == [cluster.names[1]]
    f = report.facts[cluster.names[1]]
    assert f.reason.startswith("host key changed"), f.reason
    assert f"ssh-keygen -R {cluster.hosts[1].addr} -f {known}" in f.fix
    lines = known.read_text().splitlines()
    assert lines[0] + "\n" == wrong_line and len(lines) == 3  # the others were added, gl-n1's kept
    # strict or not, a changed key is refused
    report = check(cluster, opts(cluster, tmp_path, strict=True))
    assert report.facts[cluster.names[1]].reason.startswith("host key changed")


def test_strict_with_empty_known_hosts(cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    report = check(cluster, opts(cluster, tmp_path, strict=True, timeout=5.0))
    assert len(report.failures()) == 3
    for h in cluster.hosts:
        f = report.facts[h.name]
        assert f.reason.startswith(f"unknown host key for {h.addr}"), f.reason
        assert "--strict-host-keys" in f.reason and "ssh-keyscan" in f.fix
    assert known.read_text() == ""
    # the cluster's real known_hosts file: all fine
    report = check(cluster, opts(cluster, tmp_path, strict=True, known_hosts=cluster.known_hosts))
    assert report.ok, report.render_table()


def test_login_node_in_the_cluster(cluster, tmp_path):
    """Run on host 0 as the login node: it is probed locally (no SSH) and, as the master, holds a
    listener on the master port that the other hosts must reach."""
    # this host has 4 Gaudi 2 cards (the hl-smi stand-in, tests/standin/bin/hl-smi); the others none
    env = {**os.environ, **gaudi_tools.settings("gaudi2", os.environ["PATH"], GAUDI_STANDIN_CARD_COUNT="4")}
    ssh = dataclasses.asdict(opts(cluster, tmp_path))
    got = check_in_host0(
        cluster, env=env, hosts=cluster.names, ssh=ssh, master_port=29578, devices_needed={cluster.names[0]: 4}
    )
    assert got["ok"], got["table"]
    f0 = got["facts"][cluster.names[0]]
    assert f0["hostname"] == cluster.names[0] and f0["devices"] == 4 and f0["port_free"] is True
    assert all(f["master_reachable"] for f in got["facts"].values())
    assert got["warnings"] == [f"device count not checked (no hl-smi) on {cluster.names[1]}, {cluster.names[2]}"]

    # too few devices on the login node, and its master port busy
    holder = cluster.popen_on(
        0,
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('', 29579)); s.listen();"
            "print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "up"
        got = check_in_host0(
            cluster, env=env, hosts=cluster.names, ssh=ssh, master_port=29579, devices_needed={cluster.names[0]: 8}
        )
    finally:
        holder.kill()
        holder.wait()
    assert not got["ok"]
    f0 = got["facts"][cluster.names[0]]
    assert "hl-smi sees 4 Gaudi device(s), 8 needed" in f0["reason"], f0["reason"]
    assert "master port 29579 is busy" in f0["reason"] and f0["port_free"] is False
    # the others still reach the master (a listener of the pre-flight's own on another port)
    assert all(got["facts"][h]["ok"] and got["facts"][h]["master_reachable"] for h in cluster.names[1:])


def test_remote_master_port_busy(cluster, tmp_path):
    """From the root namespace every host is remote: the master's own probe finds its port taken."""
    report = check(cluster, opts(cluster, tmp_path), master_port=22)  # the master's sshd listens there
    assert [f.host for f in report.failures()] == [cluster.names[0]]
    f = report.facts[cluster.names[0]]
    assert "master port 22 is busy" in f.reason and f.port_free is False


def test_unreachable_master(cluster, tmp_path):
    """Workers cannot reach the master address (the master's sshd is down): every host says so."""
    hosts = [cluster.names[1], cluster.names[2]]
    report = check_hosts(
        hosts,
        python=sys.executable,
        script=SCRIPT,
        cwd=REPO,
        master_host=cluster.names[0],
        master_addr=f"10.{cluster.octet}.0.1",
        master_port=29577,
        devices_needed={},
        ssh=opts(cluster, tmp_path),
        local=lambda h: False,
    )
    # 10.x.0.1 is the bridge: the root namespace has no sshd there, so port 22 is refused
    for h in hosts:
        f = report.facts[h]
        assert not f.ok and f.master_reachable is False
        assert f"cannot reach the master 10.{cluster.octet}.0.1:22" in f.reason, f.reason
