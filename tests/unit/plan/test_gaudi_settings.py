"""What ranks get on a Gaudi host (plan/gaudi.py): the recipe cache per job, the execution mode, CPU binding, and
how the plan and the planner show and check them (hl-smi stand-in on PATH, a sysfs of our own)."""

import json
import os
import subprocess
import sys

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import gaudi
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.wire import SYSFS

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
STANDIN_BIN = os.path.abspath(os.path.join(ROOT, "tests", "standin", "bin"))
STANDIN = os.path.abspath(os.path.join(ROOT, "tests", "standin"))

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 fs:/home rw,vers=4.2
41 40 8:2 / /home/scratch rw shared:21 - xfs /dev/sdb1 rw
"""


def test_fs_type_takes_the_longest_mount_point():
    assert gaudi.fs_type("/tmp/gaudi-launch-1", MOUNTINFO) == "ext4"
    assert gaudi.fs_type("/home/u/tmp", MOUNTINFO) == "nfs4"
    assert gaudi.fs_type("/home/scratch/x", MOUNTINFO) == "xfs"
    assert gaudi.fs_type("/homer", MOUNTINFO) == "ext4"


def test_recipe_cache_in_the_jobs_directory():
    # a local disk: three fields on every release (the open 1.19 bridge, recipe_cache_config.cpp
    # RecipeCacheConfig::reload, asserts 1 to 3; no stored page says which release first took a fourth)
    value, why = gaudi.recipe_cache_setting({}, "/tmp/gaudi-launch-ab", False, (1, 22))
    assert value == "/tmp/gaudi-launch-ab/recipe-cache,false,1024"  # <path>,<delete>,<MB>
    assert why.startswith("three fields")
    # a network filesystem, the only case that needs <RECIPE_CACHE_ON_NFS>, on a release whose page has it
    value, why = gaudi.recipe_cache_setting({}, "/home/u/gaudi-launch-ab", True, (1, 23))
    assert value == "/home/u/gaudi-launch-ab/recipe-cache,false,1024,true" and "<RECIPE_CACHE_ON_NFS>" in why


def test_recipe_cache_on_an_older_stack_has_three_fields_and_avoids_nfs():
    value, _ = gaudi.recipe_cache_setting({}, "/tmp/j", False, (1, 19))
    assert value == "/tmp/j/recipe-cache,false,1024"  # the 1.19 bridge asserts 1 to 3 fields
    assert gaudi.recipe_cache_setting({}, "/tmp/j", False, None)[0] == "/tmp/j/recipe-cache,false,1024"
    value, why = gaudi.recipe_cache_setting({}, "/home/j", True, (1, 21))
    assert value is None and "network filesystem" in why and "TMPDIR" in why


def test_recipe_cache_the_user_set_stands():
    value, why = gaudi.recipe_cache_setting({"PT_HPU_RECIPE_CACHE_CONFIG": "/d,true,64"}, "/tmp/j", False, (1, 22))
    assert value is None and "as you set it" in why


@pytest.mark.parametrize(
    "env, args, version, mode",
    [
        ({"PT_HPU_LAZY_MODE": "1"}, ["--torch_compile"], (1, 22), "lazy"),  # the user's value stands
        ({}, ["--torch_compile"], (1, 19), "eager"),
        ({}, ["--use_lazy_mode"], (1, 22), "lazy"),
        ({}, ["--use_lazy_mode", "false"], (1, 19), "eager"),
        ({}, [], (1, 19), "lazy"),  # the stack's default: lazy up to 1.20
        ({}, [], (1, 22), "eager"),  # eager from 1.21
        ({}, [], None, "stack default"),
    ],
)
def test_execution_mode(env, args, version, mode):
    assert gaudi.execution_mode(env, args, version)[0] == mode


def test_stack_version_reads_the_bridges_version():
    assert gaudi.stack_version("1.22.0.740") == (1, 22)
    assert gaudi.stack_version("garbage") is None


_READ_VERSION = (  # importlib.metadata forgotten first, in case the interpreter's start loaded it
    "import importlib, sys\n"
    "sys.modules.pop('importlib.metadata', None)\n"
    "importlib.__dict__.pop('metadata', None)\n"
    "from gaudi_launch.plan import gaudi\n"
    "print(gaudi.stack_version(), 'importlib.metadata' in sys.modules)\n"
)


@pytest.mark.parametrize(
    "dist_infos, expected",
    [
        # a stand-in of the installed bridge: `pip install habana-torch-plugin==1.22.0.740` puts the package
        # habana_frameworks and the wheel's habana_torch_plugin-1.22.0.740.dist-info side by side
        (["habana_torch_plugin-1.22.0.740"], {"(1, 22) False"}),
        # two of them (a broken upgrade): not guessed from the names, importlib.metadata decides as before (the
        # first its directory listing gives)
        (["habana_torch_plugin-1.22.0.740", "habana_torch_plugin-1.21.1.11"], {"(1, 22) True", "(1, 21) True"}),
        # none: no bridge installed (the package alone), importlib.metadata says so
        ([], {"None True"}),
    ],
)
def test_stack_version_of_a_stand_in_bridge_reads_its_dist_info_beside_the_package(tmp_path, dist_infos, expected):
    """Every Gaudi rank asks at its start (the recipe cache): the name of the dist-info beside habana_frameworks
    answers without importing importlib.metadata (issue 34: the bootstrap's CPU per host); importlib.metadata,
    which the answer must agree with, is asked only when the names do not say."""
    (tmp_path / "habana_frameworks").mkdir()
    (tmp_path / "habana_frameworks" / "__init__.py").write_text("")
    for name in dist_infos:
        version = name.split("-", 1)[1]
        (tmp_path / f"{name}.dist-info").mkdir()
        (tmp_path / f"{name}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: habana-torch-plugin\nVersion: {version}\n"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.abspath(ROOT)])}
    res = subprocess.run([sys.executable, "-c", _READ_VERSION], env=env, capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() in expected, res.stderr


def test_no_bridge_package_is_no_bridge_without_importing_importlib_metadata(tmp_path):
    """A machine without Gaudi (most launching hosts, every dry run here): habana_frameworks does not import, so
    there is no bridge, and importlib.metadata's import (about 15 ms of a dry run) is not paid to learn it."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT)}
    res = subprocess.run([sys.executable, "-c", _READ_VERSION], env=env, capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "None False", res.stderr


def test_cpu_bind_none_reaches_every_rank_and_turns_binding_off():
    assert gaudi.cpu_bind_env("none") == {"GAUDI_LAUNCH_CPU_BIND": "none"}
    assert gaudi.cpu_bind_env("numa") == {}
    with pytest.raises(UserError, match="--cpu-bind"):
        JobSpec(program=["x.py"], cpu_bind="socket").validate()


def sysfs(tmp_path, node_of_index, cpulists):
    """A sysfs tree for the stand-in's Gaudi 2 cards: NUMA node per card index, CPUs per node."""
    out = subprocess.run(
        [os.path.join(STANDIN_BIN, "hl-smi"), "-Q", "index,bus_id", "-f", "csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        index, bus = (p.strip() for p in line.split(","))
        d = tmp_path / "sys" / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node_of_index(int(index))}\n")
    for node, cpus in cpulists.items():
        d = tmp_path / "sys" / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return str(tmp_path / "sys")


@pytest.fixture
def gaudi_host(monkeypatch):
    monkeypatch.setenv("PATH", STANDIN_BIN + os.pathsep + os.environ["PATH"])
    for name in ("HABANA_VISIBLE_MODULES", "PT_HPU_RECIPE_CACHE_CONFIG", "PT_HPU_LAZY_MODE"):
        monkeypatch.delenv(name, raising=False)


def test_include_of_an_unsupported_pair_is_refused_by_module_id(gaudi_host):
    with pytest.raises(UserError) as err:
        build_plan(JobSpec(program=["x.py"], include="localhost:0,3", num_devices=8), backends=get_backend)
    assert "module ids 0,3" in str(err.value) and err.value.where == "--include"
    build_plan(
        JobSpec(program=["x.py"], include="localhost:2,3", num_devices=8), backends=get_backend
    )  # a supported pair
    with pytest.raises(UserError, match="module ids 0,1,2"):
        build_plan(JobSpec(program=["x.py"], num_devices=3), backends=get_backend)


def test_dry_run_shows_binding_recipe_cache_and_mode(gaudi_host, monkeypatch, tmp_path):
    root = sysfs(tmp_path, lambda i: 0 if i < 4 else 1, {0: "0-3,8-11", 1: "4-7,12-15"})
    monkeypatch.setenv(SYSFS, root)  # where this host's probe reads the cards' NUMA nodes (probe.sh)
    plan = build_plan(JobSpec(program=["x.py", "--torch_compile"], num_devices=2), backends=get_backend)
    notes = "\n".join(plan.notes)
    # local ranks 0 and 1 take modules 0 and 1: indices 6 and 7 on this server, NUMA node 1, half of it each
    assert "localhost local rank 0 (card module 0, NUMA node 1): cores 4-5,12-13" in notes
    assert "localhost local rank 1 (card module 1, NUMA node 1): cores 6-7,14-15" in notes
    suffix = plan.env["GAUDI_LAUNCH_JOB_DIR_SUFFIX"]  # the ranks' job directory's (issue 36 item 4)
    assert f"gaudi-launch-{plan.job_id}-{suffix}/recipe-cache,false,1024" in notes
    assert "execution mode: eager (--torch_compile on the script's command line)" in notes
    plan = build_plan(JobSpec(program=["x.py"], num_devices=2, cpu_bind="none"), backends=get_backend)
    assert plan.env["GAUDI_LAUNCH_CPU_BIND"] == "none" and "CPU binding: none (--cpu-bind none)" in plan.notes


def test_rank_binds_itself_and_gets_the_recipe_cache(gaudi_host, tmp_path):
    """One real rank through the local backend and the worker: bound to its card's node, the recipe cache in
    its job's directory in the form the (stand-in 1.19) bridge accepts at import."""
    cpus = sorted(os.sched_getaffinity(0))
    # module 0 is card index 6: put it alone on node 1, which holds this machine's last CPU
    root = sysfs(tmp_path, lambda i: 1 if i == 6 else 0, {0: str(cpus[0]), 1: str(cpus[-1])})
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os\n"
        "import habana_frameworks.torch.core\n"
        "print('SEEN ' + json.dumps({'cpus': sorted(os.sched_getaffinity(0)),"
        " 'cache': os.environ.get('PT_HPU_RECIPE_CACHE_CONFIG')}))\n"
    )
    env = {**os.environ, "GAUDI_LAUNCH_SYSFS": root, "PYTHONPATH": STANDIN, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["cpus"] == [cpus[-1]]
    assert seen["cache"].startswith(str(tmp_path) + "/gaudi-launch-")
    assert seen["cache"].endswith("/recipe-cache,false,1024")
    env["GAUDI_STANDIN_CARDS"] = "gaudi2"
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", "--cpu-bind", "none", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.split("SEEN ", 1)[1].splitlines()[0])["cpus"] == cpus


def test_mpirun_leaves_binding_to_the_ranks(tmp_path, monkeypatch):
    """mpirun's PE mapping bound rank i to the i-th block of cores whatever its card: it binds none now."""
    from gaudi_launch.backends import mpirun

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    plan = build_plan(
        JobSpec(program=["x.py"], hostfile="hostfile", backend="mpirun", ssh_check=False), backends=get_backend
    )
    plan.cores_per_host = 224  # what a pre-flight finds on a 2-socket Gaudi 2 server
    argv = mpirun.commands(plan, {})[0].argv
    assert argv[argv.index("--map-by") + 1] == "ppr:8:node" and argv[argv.index("--bind-to") + 1] == "none"


@pytest.mark.parametrize("version, shown", [((1, 22), "eager"), ((1, 19), "lazy")])
def test_env_report_says_which_mode_ranks_run_in(version, shown, monkeypatch):
    from gaudi_launch.reports import environment

    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    monkeypatch.setattr(gaudi, "stack_version", lambda: version)
    info = environment.collect()
    assert info["execution_mode"].startswith(f"{shown} (the default of the installed Gaudi software")
    assert f"execution mode           {shown} (" in environment.render(info)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert environment.collect()["execution_mode"] == "lazy (PT_HPU_LAZY_MODE=1 as you set it)"
