"""A 3-node Slurm cluster (slurmctld, munged, one slurmd per network namespace) for the session."""

from __future__ import annotations

import os

import pytest

from tests.cluster.netcluster import _link_names, _netns_names
from tests.slurm.slurmcluster import SlurmCluster, missing_requirements


def require_slurm_support() -> None:
    """Skip (locally) or fail (CI=true: these tests must never be skipped there) when the machine
    cannot host the cluster."""
    missing = missing_requirements()
    if not missing:
        return
    reason = "Slurm test cluster needs: " + ", ".join(missing)
    if any(not m.startswith("root") for m in missing):
        reason += " (install them with scripts/install-system-deps.sh as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    require_slurm_support()
    c = SlurmCluster(3, str(tmp_path_factory.mktemp("slurmcluster")))
    c.up()
    try:
        yield c
    finally:
        c.down()
    left = [n for n in _netns_names() if n in c.names] + [n for n in _link_names() if n in c.veths]
    assert not left, f"Slurm cluster teardown left: {left}"
