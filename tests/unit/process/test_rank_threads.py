"""A rank bound to its card's cores (--cpu-bind numa, the default on a Gaudi host) runs one OpenMP thread per
physical core it is bound to, unless the user set OMP_NUM_THREADS (process/worker.py, plan/gaudi.py's
omp_threads, as PyTorch's CPU launcher torch.backends.xeon.run_cpu does)."""

import json
import os
import subprocess
import sys

import pytest

from gaudi_launch.plan import gaudi
from tests.standin import gaudi_tools

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
STANDIN = os.path.abspath(os.path.join(ROOT, "tests", "standin"))


def test_one_thread_per_physical_core():
    # cores 0-3 and their hyperthreads 8-11: four cores
    siblings = {c: [c % 8, c % 8 + 8] for c in (0, 1, 2, 3, 8, 9, 10, 11)}
    assert gaudi.omp_threads([0, 1, 2, 3, 8, 9, 10, 11], siblings) == 4
    assert gaudi.omp_threads([0, 1, 8], siblings) == 2
    assert gaudi.omp_threads([5, 6, 7], {}) == 3  # no topology known: each CPU a core
    assert gaudi.omp_threads([], {}) == 1


def sysfs_with_siblings(root, cpus: list[int]) -> str:
    """Every card of the stand-in's Gaudi 2 server on NUMA node 0, which holds ``cpus``; the first two are
    hyperthreads of one core."""
    out = subprocess.run(
        [os.path.join(gaudi_tools.BIN, "hl-smi"), "-Q", "bus_id", "-f", "csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GAUDI_STANDIN_CARDS": "gaudi2"},
    ).stdout
    for bus in out.split():
        d = root / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text("0\n")
    node = root / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text(",".join(map(str, cpus)) + "\n")
    for cpu in cpus:
        topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        pair = cpus[:2] if cpu in cpus[:2] else [cpu]
        (topo / "thread_siblings_list").write_text(",".join(map(str, pair)) + "\n")
    return str(root)


def rank_sees(tmp_path, *flags: str, **env_extra: str) -> dict:
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os\n"
        "print('SEEN ' + json.dumps({'cpus': sorted(os.sched_getaffinity(0)),"
        " 'threads': os.environ.get('OMP_NUM_THREADS')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "HABANA_VISIBLE_MODULES")}
    env.update(gaudi_tools.settings("gaudi2", env["PATH"]))
    env.update(PYTHONPATH=STANDIN, TMPDIR=str(tmp_path), **env_extra)
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", *flags, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.split("SEEN ", 1)[1].splitlines()[0])


def test_a_bound_rank_runs_one_thread_per_physical_core_unless_told(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one core's two hyperthreads")
    root = sysfs_with_siblings(tmp_path / "sys", cpus)
    seen = rank_sees(tmp_path, GAUDI_LAUNCH_SYSFS=root)
    # bound to the whole node (one rank on it), whose first two CPUs are one core
    assert seen == {"cpus": cpus, "threads": str(len(cpus) - 1)}
    # yours is kept
    assert rank_sees(tmp_path, GAUDI_LAUNCH_SYSFS=root, OMP_NUM_THREADS="3")["threads"] == "3"
    # not bound: the host's CPUs shared among its ranks, as before
    assert rank_sees(tmp_path, "--cpu-bind", "none", GAUDI_LAUNCH_SYSFS=root)["threads"] == str(os.cpu_count())
