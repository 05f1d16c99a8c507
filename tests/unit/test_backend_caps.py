"""Backends by what they can do (issue 37 item 1): the core asks a backend's capabilities in the registry
(inputs/backend_options.py ``BACKENDS``), never its name; a new backend is a module and a registry entry."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional

import pytest

from gaudi_launch.backends.job import start_timeout_for
from gaudi_launch.errors import UserError
from gaudi_launch.inputs import backend_options
from gaudi_launch.inputs.backend_options import (
    BACKENDS,
    OWNER,
    BackendOptions,
    Capabilities,
    options_from,
    register,
)
from gaudi_launch.inputs.options import opt
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.wire import NODE_DEVICES
from tests.unit.cli_helpers import plan_of, user_error

PKG = Path(__file__).resolve().parents[2] / "gaudi_launch"
# Where a backend may be named: its own package and the registry.
MAY_NAME = ("backends/", "inputs/backend_options.py")


def comparisons_by_name(source: str, names) -> list[int]:
    """Lines that compare something called *backend* with a backend's name (==, !=, in, not in; a name in
    a tuple, list or set counts). Pure."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        literals = set()
        for part in parts:
            items = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
            literals |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if literals & set(names) and any("backend" in ast.unparse(p).lower() for p in parts):
            found.append(node.lineno)
    return found


def test_the_walk_sees_a_comparison_by_name_and_not_others():
    src = (
        'if plan.backend == "slurm": pass\n'
        'x = spec.backend in ("auto", "local")\n'
        'y = "mpirun" != backend\n'
        'z = env.get(RANKS_FROM) == "slurm"\n'  # a wire value, not a backend's name
        'w = info.dist_backend == "hccl"\n'
        "v = caps(plan.backend).scheduler\n"
    )
    assert comparisons_by_name(src, BACKENDS) == [1, 2, 3]


def test_no_module_outside_backends_and_the_registry_compares_a_backend_by_name():
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(MAY_NAME):
            continue
        lines = comparisons_by_name(path.read_text(encoding="utf-8"), BACKENDS)
        if lines:
            found[rel] = lines
    assert found == {}, "ask inputs/backend_options.capabilities(...), not the backend's name"


def test_the_shipped_backends_declare_what_the_core_did_by_name():
    local, mpirun, deepspeed, slurm = (BACKENDS[n] for n in ("local", "mpirun", "deepspeed", "slurm"))
    assert not local.multi_host and not local.one_command and not local.ssh_preflight
    assert all(c.multi_host and c.one_command for c in (mpirun, deepspeed, slurm))
    assert mpirun.ssh_preflight and deepspeed.ssh_preflight and not slurm.ssh_preflight
    assert [n for n, c in BACKENDS.items() if c.rewrites_visibility] == ["deepspeed"]
    assert (
        [n for n, c in BACKENDS.items() if c.scheduler]
        == ["slurm"]
        == [n for n, c in BACKENDS.items() if c.batch_script]
    )
    assert [n for n, c in BACKENDS.items() if c.start_timeout is None] == ["slurm"]
    assert mpirun.openmpi(None) and not deepspeed.openmpi(None) and not local.openmpi(None)
    assert deepspeed.openmpi(backend_options.DeepSpeedOptions(launcher="openmpi"))
    assert {n: c.options for n, c in BACKENDS.items() if c.options} == backend_options.REGISTRY


# ---------------------------------------------------------------- a new backend: tests/unit/backends/pdsh_like.py

PDSH_LIKE = Capabilities(
    "tests.unit.backends.pdsh_like", multi_host=True, one_command=True, ssh_preflight=True, start_timeout=120.0
)


@pytest.fixture
def pdsh_like():
    undo = register("pdsh-like", PDSH_LIKE)
    yield "pdsh-like"
    undo()
    assert "pdsh-like" not in BACKENDS


@pytest.fixture
def two_hosts(tmp_path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=4\nworker-1 slots=4\n", encoding="utf-8")
    return str(path)


@pytest.mark.usefixtures("isolated")
def test_a_backend_registered_from_a_test_is_planned_by_its_capabilities(capsys, pdsh_like, two_hosts):
    plan = plan_of(
        capsys, "--hostfile", two_hosts, "--backend", pdsh_like, "--include", "worker-0:0,1@worker-1:2,3", "t.py"
    )
    assert plan["backend"] == "pdsh-like"
    assert plan["master_addr"] == "worker-0"  # multi-host: the first host, not 127.0.0.1
    [command] = plan["commands"]  # one command for every node ...
    assert command["argv"][:3] == ["pdsh", "-w", "worker-0,worker-1"]
    assert plan["env"][NODE_DEVICES]  # ... so each node's device subset travels in the job's variables
    assert "pdsh-like test backend: nothing looked at" in plan["notes"]  # its detect ran
    assert any("no pre-flight (--no-ssh-check)" in n for n in plan["notes"])  # ssh hosts: host settings applied
    assert start_timeout_for(JobSpec(program=["t.py"]), pdsh_like) == 120.0


@pytest.mark.usefixtures("isolated")
def test_a_one_host_backend_refuses_another_host_by_its_capability(capsys, two_hosts):
    undo = register("here-only", dataclasses.replace(PDSH_LIKE, multi_host=False, one_command=False))
    try:
        err = user_error(capsys, "--hostfile", two_hosts, "--backend", "here-only", "--dry-run", "t.py")
    finally:
        undo()
    assert "the here-only backend runs on this host only, but 'worker-0' is another host" in err
    assert "--backend mpirun or --backend deepspeed" in err


def test_an_unknown_backend_names_the_registered_ones():
    with pytest.raises(UserError) as info:
        JobSpec(program=["t.py"], backend="pdsh").validate()
    assert info.value.hint == "one of: auto, local, mpirun, deepspeed, slurm"


@dataclass(frozen=True)
class PdshLikeOptions(BackendOptions):
    panel: ClassVar[str] = "pdsh-like"

    fanout: Optional[int] = field(default=None, metadata=opt("--pdsh-fanout", help="pdsh's -f.", panel="pdsh-like"))


def test_the_options_a_registered_backend_takes_are_its_own():
    undo = register("pdsh-like", dataclasses.replace(PDSH_LIKE, options=PdshLikeOptions))
    try:
        assert options_from("pdsh-like", {"fanout": 32}) == PdshLikeOptions(fanout=32)
        with pytest.raises(UserError) as info:
            options_from("mpirun", {"fanout": 32})
        assert info.value.message == "--pdsh-fanout is an option of --backend pdsh-like, not of --backend mpirun"
    finally:
        undo()
    assert "fanout" not in OWNER and "pdsh-like" not in backend_options.REGISTRY


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_an_unknown_backend_is_a_user_error_before_and_in_planning(capsys, dry_run):
    (Path.cwd() / "t.py").write_text("")
    err = user_error(capsys, "--backend", "pdsh", *dry_run, "t.py")
    assert (
        err
        == "gaudi-launch: error: --backend: unknown backend 'pdsh'\n  hint: one of: auto, local, mpirun, deepspeed, slurm\n"
    )
