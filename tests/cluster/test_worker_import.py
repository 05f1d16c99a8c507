"""The pre-flight checks on every host that the workers' Python can import gaudi_launch (its rank
bootstrap, gaudi_launch.process.worker) with the job's working directory first on sys.path, as the ranks
will: one host whose --python lacks it fails the pre-flight in the same table, named with the interpreter
and what to do, and nothing starts. Before, the job started and the ranks there died at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster.test_multinode import launch_argv

# --python on every host: the venv's interpreter (with gaudi_launch), but on one host the interpreter it
# was made from, where gaudi-launch was never installed (as a host missed by the install).
PYTHON = """#!/bin/sh
if [ "$(hostname)" = {host} ]; then
    exec {bare} "$@"
fi
exec {python} "$@"
"""


def test_a_host_whose_python_lacks_gaudi_launch_fails_the_preflight_naming_it(cluster, tmp_path):
    bare = os.path.join(sys.base_prefix, "bin", "python3")
    if subprocess.run([bare, "-c", "import gaudi_launch"], cwd="/", capture_output=True).returncode == 0:
        pytest.skip(f"{bare}, the interpreter the venv was made from, has gaudi_launch itself")
    python = tmp_path / "python"
    python.write_text(PYTHON.format(host=cluster.names[1], bare=bare, python=sys.executable))
    python.chmod(0o755)
    job = tmp_path / "job"  # the working directory: no gaudi_launch in it
    job.mkdir()
    (job / "train.py").write_text("print('rank up', flush=True)\n")
    env = cluster.env()
    env.pop("PYTHONPATH", None)  # (the ranks would get it: the check looks there too)
    res = cluster.run_on(
        0,
        launch_argv(
            cluster, "mpirun", cluster.hostfile(slots=1, hosts=[0, 1]), "train.py", extra=["--python", str(python)]
        ),
        env=env,
        cwd=str(job),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 3, out[-3000:]  # the pre-flight failed: nothing was started
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(tuple(cluster.names[:2]))}
    assert " OK " in rows[cluster.names[0]], out[-3000:]
    assert (
        f"failed  python {python} cannot import gaudi_launch on {cluster.names[1]} (with {job} first on "
        "sys.path, as the ranks have it): ModuleNotFoundError: No module named 'gaudi_launch'"
    ) in rows[cluster.names[1]], out[-3000:]
    assert f"fix: install it in that Python there ({python} -m pip install gaudi-launch==" in out
    assert "or give --python an interpreter that has it on every host" in out
    assert "rank up" not in out
