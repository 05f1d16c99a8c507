"""Fixtures for tests that need real hosts: a 3-host NetCluster (netns + sshd per host) for the session."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from tests.cluster.netcluster import NetCluster, missing_requirements

# Tools the launcher tests drive across the cluster, beyond what building it needs.
LAUNCH_TOOLS = ("mpirun", "pdsh")


def cluster_missing() -> list:
    return missing_requirements() + [t for t in LAUNCH_TOOLS if shutil.which(t) is None]


def require_cluster_support() -> None:
    """Skip (locally) or fail (CI=true: these tests must never be skipped there) when the machine
    cannot host the cluster."""
    missing = cluster_missing()
    if not missing:
        return
    reason = "multi-host test cluster needs: " + ", ".join(missing)
    if any(not m.startswith("root") for m in missing):
        reason += " (install them with scripts/install-system-deps.sh as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def leftovers(c: NetCluster, pids) -> list:
    """Anything of cluster `c` still present: its netns, links, live processes (zombies count as gone)."""
    from tests.cluster import netcluster as nc

    left = [n for n in nc._netns_names() if n in {h.netns for h in c.hosts}]
    left += [n for n in nc._link_names() if n in {h.veth for h in c.hosts} | {c.bridge}]
    left += [f"pid {p}" for p, start in pids.items() if nc._alive(p, start)]
    return left


def cluster_pids(c: NetCluster) -> dict:
    from tests.cluster import netcluster as nc

    pids = {}
    for h in c.hosts:
        for p in (h.sshd, h.anchor):
            if p is not None:
                pids[p.pid] = nc._proc_start(p.pid)
    return pids


@contextlib.contextmanager
def running(c: NetCluster):
    """Bring ``c`` up for the block, take it down after, and fail if anything of it is left."""
    c.up()
    pids = cluster_pids(c)
    try:
        yield c
    finally:
        # pids may have changed (stop_sshd/start_sshd): track both the first and the current ones
        pids.update(cluster_pids(c))
        c.down()
    left = leftovers(c, pids)
    assert not left, f"cluster teardown left: {left}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    require_cluster_support()
    with running(NetCluster(3, str(tmp_path_factory.mktemp("netcluster")))) as c:
        yield c


@pytest.fixture
def launcher_env(cluster):
    """Environment for commands run on host 0: os.environ with the cluster's ssh wrapper first on PATH."""
    return cluster.env()
