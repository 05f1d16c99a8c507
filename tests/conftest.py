"""Fixtures shared across test folders, the test tiers, and the Gaudi stand-in's device registration."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
STAND_IN_DIR = str(TESTS / "standin")

# hpu_stand_in: the habana_frameworks stand-in (tests/standin), for tests named "stand_in".
pytest_plugins = ["tests.standin.fixture"]

# Test tiers (pyproject's markers), given by folder, file or test (paths under tests/), so that a new test
# gets its folder's tier without a decorator. slow: seconds each (real processes, torch, fuzzing);
# cluster: root, network namespaces, sshd, Slurm or Docker; lint: ruff, mypy, shellcheck, hadolint.
# `pytest --quick` (scripts/test.sh --quick) leaves all three out; CI runs everything.
TIERS = {
    "cluster": ("cluster", "slow"),
    "slurm": ("cluster", "slow"),
    "docker": ("cluster", "slow"),
    "integration": ("slow",),
    "integration/test_private_files.py": ("cluster",),  # root: files of another user (uid 65534)
    "integration/test_teardown_other_users.py": ("cluster",),  # root: another user's processes
    "equivalence": ("slow",),
    "runtime": ("slow",),
    "unit/test_lint.py": ("lint",),
    "unit/test_dockerfile.py::test_shellcheck_clean_on_entrypoint_and_scripts": ("lint",),
    "unit/test_dockerfile.py::test_hadolint_clean_on_dockerfile": ("lint",),
    "unit/test_fuzz_plan.py": ("slow",),
    "unit/test_fuzz_cli.py": ("slow",),
    "unit/test_extras.py": ("slow",),  # pip resolves in a subprocess
    "unit/process/test_hangs.py::test_only_the_ranks_own_live_processes_are_asked_for_stacks": ("slow",),
    "unit/remote/test_fanout.py::test_a_host_past_the_timeout_gets_the_default": ("slow",),
    "unit/plan/test_gaudi_settings.py::test_rank_binds_itself_and_gets_the_recipe_cache": ("slow",),
}
QUICK_LEAVES_OUT = {"slow", "cluster", "lint"}


def tiers_of(where: str) -> set[str]:
    """The tiers of a folder, file or test id, written relative to tests/ ('unit/test_x.py::test_y[a]'). Pure."""
    out: set[str] = set()
    for key, marks in TIERS.items():
        if where == key or any(where.startswith(key + sep) for sep in ("/", "::", "[")):
            out.update(marks)
    return out


def _relative(path: Path) -> str:
    try:
        return Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return ""


def pytest_configure(config):
    # A run that hangs must say where before CI's 90 minutes stop it silently: past
    # TEST_SESSION_DEADLINE_S (set by .ci/run) every thread's stack goes to stderr and the run exits.
    # pytest-timeout (pyproject) bounds each test; this bounds what it cannot see, such as collection.
    deadline = float(os.environ.get("TEST_SESSION_DEADLINE_S", "0") or 0)
    if deadline > 0:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is None:  # -p no:capture
            stderr = os.dup(2)
        else:
            with capture.global_and_fixture_disabled():  # the real stderr, not the capture's file
                stderr = os.dup(2)
        faulthandler.dump_traceback_later(deadline, exit=True, file=stderr)


def torch_extension_locks() -> list[Path]:
    """torch's JIT build locks (torch.utils.cpp_extension's FileBaton), under TORCH_EXTENSIONS_DIR or its default."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return [*root.glob("*/lock"), *root.glob("*/*/lock")]


@pytest.fixture(autouse=True)
def _no_orphaned_torch_build_lock():
    """After each test, when all its processes are gone, a torch build lock left is an orphan.

    DeepSpeed's CPU ranks JIT-load its shm_comm op through torch's FileBaton in every process; a rank
    killed in that second (tests kill ranks at start-up on purpose) leaves the lock, and every later
    DeepSpeed rank on this machine waits for it for ever. Removed here, with a warning that says so.
    """
    yield
    for lock in torch_extension_locks():
        lock.unlink(missing_ok=True)
        warnings.warn(f"removed {lock}, left by a process killed while it held torch's build lock", stacklevel=1)


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help="the quick tier: leave out tests marked slow, cluster or lint (tiers: tests/conftest.py)",
    )


def pytest_ignore_collect(collection_path, config):
    # Under --quick a folder or file whose tests are all left out is not even imported (torch, DeepSpeed).
    if config.getoption("quick") and tiers_of(_relative(collection_path)) & QUICK_LEAVES_OUT:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    kept, left_out = [], []
    for item in items:
        rel = _relative(item.path)
        where = rel + item.nodeid[item.nodeid.index("::") :] if "::" in item.nodeid else rel
        marks = tiers_of(where)
        for mark in sorted(marks):
            item.add_marker(mark)
        marks |= {m.name for m in item.iter_markers()}
        (left_out if config.getoption("quick") and marks & QUICK_LEAVES_OUT else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_collectstart(collector):
    # The stand-in's HPU device must be registered with torch before anything in this process asks
    # torch for its accelerator (torch caches the answer's hooks): so before the first test module
    # outside tests/unit is imported (they import torch, transformers, DeepSpeed), and never for unit
    # tests alone, which do not import torch. It stays inactive, and invisible to other tests, until a
    # test loads the stand-in bridge. Registered under its top-level name, the one the stand-in's
    # modules import it by.
    if not isinstance(collector, pytest.Module) or "hpu_stand_in_device" in sys.modules:
        return
    rel = _relative(collector.path)
    if not rel or rel.startswith("unit/"):
        return
    spec = importlib.util.spec_from_file_location("hpu_stand_in_device", f"{STAND_IN_DIR}/hpu_stand_in_device.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hpu_stand_in_device"] = module
    spec.loader.exec_module(module)
    module.register_device()
