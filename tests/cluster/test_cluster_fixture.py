"""The multi-host test cluster is real: own hostnames, name resolution, ssh, mpirun and pdsh across hosts,
sshd down / host gone failure modes, clean teardown (also after a crash, and of a half-built cluster)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster import netcluster as nc
from tests.cluster.conftest import cluster_pids, leftovers, require_cluster_support
from tests.cluster.netcluster import NetCluster

T = 30  # generous per-command timeout


def on(cluster, i, argv, env=None, timeout=T, **kw):
    return cluster.run_on(i, argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def test_each_host_has_its_own_hostname(cluster):
    for h in cluster.hosts:
        r = on(cluster, h.index, ["hostname"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == h.name
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() not in cluster.names


def test_run_on_keeps_cwd_and_env(cluster, tmp_path):
    r = on(
        cluster,
        1,
        ["sh", "-c", "pwd; echo $GL_MARK; ip -o -4 addr show eth0"],
        cwd=str(tmp_path),
        env={**os.environ, "GL_MARK": "mark"},
    )
    lines = r.stdout.splitlines()
    assert lines[0] == str(tmp_path) and lines[1] == "mark"
    assert f"inet {cluster.hosts[1].addr}/24" in lines[2]


def test_names_resolve_to_cluster_addresses_inside_hosts(cluster):
    for i in range(len(cluster.hosts)):
        for h in cluster.hosts:
            r = on(cluster, i, ["getent", "ahostsv4", h.name])
            assert r.returncode == 0 and r.stdout.split()[0] == h.addr, r
            # `getent hosts` asks for IPv6 first and gets the v4-mapped line: either form is the host
            r = on(cluster, i, ["getent", "hosts", h.name])
            assert r.stdout.split()[0] in (h.addr, f"::ffff:{h.addr}"), r
        r = on(cluster, i, ["getent", "ahostsv4", f"{cluster.prefix}-ctl"])
        assert r.stdout.split()[0] == cluster.bridge_addr
        # unknown names fail fast (resolv.conf points at 127.0.0.1, nothing leaves the machine)
        t0 = time.monotonic()
        r = on(cluster, i, ["getent", "hosts", "no-such-host.invalid"])
        assert r.returncode == 2 and time.monotonic() - t0 < 3


def test_ssh_from_host0_with_wrapper(cluster, launcher_env):
    assert launcher_env["PATH"].split(os.pathsep)[0] == cluster.bin_dir
    for h in cluster.hosts[1:]:
        r = on(cluster, 0, ["ssh", h.name, "hostname"], env=launcher_env)
        assert (r.returncode, r.stdout.strip()) == (0, h.name), r.stderr
    # by address too, and with StrictHostKeyChecking=yes (known_hosts holds the real host keys)
    r = on(cluster, 0, ["ssh", "-o", "StrictHostKeyChecking=yes", cluster.hosts[2].addr, "hostname"], env=launcher_env)
    assert (r.returncode, r.stdout.strip()) == (0, cluster.hosts[2].name), r.stderr


def test_ssh_from_root_namespace(cluster):
    r = subprocess.run(cluster.ssh_argv(1, "hostname"), capture_output=True, text=True, timeout=T)
    assert (r.returncode, r.stdout.strip()) == (0, cluster.hosts[1].name), r.stderr


def test_mpirun_across_two_hosts(cluster, launcher_env, tmp_path):
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "4",
        "--host",
        f"{cluster.hosts[0].name}:2,{cluster.hosts[1].name}:2",
        "--mca",
        "plm_rsh_args",
        f"-F {cluster.ssh_config}",
        "--mca",
        "btl_tcp_if_include",
        cluster.subnet,
        "--mca",
        "oob_tcp_if_include",
        cluster.subnet,
        "hostname",
    ]
    r = on(cluster, 0, argv, env=launcher_env, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()) == sorted([cluster.hosts[0].name] * 2 + [cluster.hosts[1].name] * 2)


def test_pdsh_over_ssh(cluster, launcher_env):
    env = {**launcher_env, "PDSH_RCMD_TYPE": "ssh"}
    r = on(
        cluster, 0, ["pdsh", "-R", "ssh", "-w", f"{cluster.hosts[1].name},{cluster.hosts[2].name}", "hostname"], env=env
    )
    assert r.returncode == 0, r.stderr
    got = sorted(line.split(": ", 1) for line in r.stdout.splitlines())
    assert got == [[h.name, h.name] for h in cluster.hosts[1:]]


def test_sshd_down_then_up_keeps_host_key(cluster, launcher_env):
    h = cluster.hosts[1]
    strict = ["ssh", "-o", "StrictHostKeyChecking=yes", h.name, "hostname"]
    try:
        cluster.stop_sshd(1)
        t0 = time.monotonic()
        r = on(cluster, 0, strict, env=launcher_env)
        assert r.returncode == 255 and "Connection refused" in r.stderr, r
        assert time.monotonic() - t0 < 2
        # the host itself is still there
        assert on(cluster, 1, ["hostname"]).stdout.strip() == h.name
    finally:
        cluster.start_sshd(1)
    r = on(cluster, 0, strict, env=launcher_env)
    assert (r.returncode, r.stdout.strip()) == (0, h.name), r.stderr


def test_cut_link_makes_host_vanish(cluster, launcher_env):
    h = cluster.hosts[2]
    argv = ["ssh", "-o", "ConnectTimeout=2", h.name, "hostname"]
    try:
        cluster.cut_link(2)
        t0 = time.monotonic()
        r = on(cluster, 0, argv, env=launcher_env)
        took = time.monotonic() - t0
        assert r.returncode == 255 and "timed out" in r.stderr, r
        assert 1.5 < took < 6
    finally:
        cluster.restore_link(2)
    r = on(cluster, 0, argv, env=launcher_env)
    assert (r.returncode, r.stdout.strip()) == (0, h.name), r.stderr


def test_second_cluster_coexists(cluster, tmp_path):
    other = NetCluster(2, str(tmp_path / "other"), prefix="glx", subnet_octet=214)
    with other:
        assert other.hosts[1].addr == "10.214.0.11"
        r = other.run_on(0, ["ssh", "glx-n1", "hostname"], env=other.env(), capture_output=True, text=True, timeout=T)
        assert (r.returncode, r.stdout.strip()) == (0, "glx-n1"), r.stderr
        # the first cluster is untouched
        assert (
            on(cluster, 0, ["ssh", cluster.hosts[1].name, "hostname"], env=cluster.env()).stdout.strip()
            == cluster.hosts[1].name
        )
    assert not leftovers(other, {})


def test_down_leaves_nothing(tmp_path):
    require_cluster_support()
    c = NetCluster(2, str(tmp_path / "c"), prefix="gld", subnet_octet=218).up()
    assert c.timings["up"] < 5
    # a session on a host, still running at teardown, goes too
    sess = c.popen_on(
        0, ["ssh", "gld-n1", "sleep", "300"], env=c.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(0.3)
    pids = cluster_pids(c)
    pids.update(nc._netns_pids("gld-n1"))
    assert len(pids) >= 4
    c.down()
    sess.wait(timeout=5)
    assert not leftovers(c, pids)
    assert not any(n.startswith("gld-") for n in nc._netns_names())
    assert not any(n.startswith("gld-") for n in nc._link_names())
    c.down()  # idempotent


def test_half_built_cluster_is_torn_down(tmp_path, monkeypatch):
    require_cluster_support()
    c = NetCluster(2, str(tmp_path / "c"), prefix="glh", subnet_octet=216)

    def broken(hosts, timeout=10.0):
        raise nc.ClusterError("injected")

    monkeypatch.setattr(c, "_wait_ready", broken)
    seen = {}
    real_spawn = c._spawn_sshd

    def spawn(h):
        real_spawn(h)
        seen[h.sshd.pid] = nc._proc_start(h.sshd.pid)

    monkeypatch.setattr(c, "_spawn_sshd", spawn)
    with pytest.raises(nc.ClusterError, match="injected"):
        c.up()
    assert len(seen) == 2
    assert not leftovers(c, seen)


def test_stale_cluster_from_a_crash_is_replaced(tmp_path):
    require_cluster_support()
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(nc.__file__)!r})
        from netcluster import NetCluster
        c = NetCluster(2, {str(tmp_path / "crashed")!r}, prefix="glz", subnet_octet=217).up()
        print(" ".join(str(h.sshd.pid) for h in c.hosts), flush=True)
        os.kill(os.getpid(), 9)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=T)
    assert r.returncode == -signal.SIGKILL, r.stderr
    stale = [int(p) for p in r.stdout.split()]
    assert "glz-n0" in nc._netns_names() and all(nc._alive(p) for p in stale)
    c = NetCluster(2, str(tmp_path / "new"), prefix="glz", subnet_octet=217).up()
    try:
        assert not any(nc._alive(p) for p in stale)
        r = c.run_on(0, ["ssh", "glz-n1", "hostname"], env=c.env(), capture_output=True, text=True, timeout=T)
        assert r.stdout.strip() == "glz-n1", r.stderr
    finally:
        c.down()
    assert not leftovers(c, {p: None for p in stale})


def test_every_test_cluster_has_its_own_prefix_and_subnet():
    # Two test clusters with one subnet or prefix cannot both be up; one whose owner died leaves links
    # only a cluster of the same prefix removes (a CI run once failed on the Slurm cluster's 10.215 left up).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pairs = {("gl", "213"), ("gls", "215")}  # NetCluster's and SlurmCluster's defaults
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name)) as f:
                    pairs |= set(re.findall(r'prefix="(\w+)", subnet_octet=(\d+)', f.read()))
    assert len(pairs) >= 7
    prefixes = [p for p, _ in pairs]
    octets = [o for _, o in pairs]
    assert len(set(prefixes)) == len(pairs) and len(set(octets)) == len(pairs), sorted(pairs)
