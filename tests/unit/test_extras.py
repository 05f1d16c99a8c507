"""pyproject.toml's extras install beside Habana's own torch (issue 23, item 5).

On a Gaudi host torch and DeepSpeed are Habana's builds (local versions such as DeepSpeed's
0.16.1+hpu.synapse.v1.22.0); habana-frameworks-torch is built against that torch, so an extra that pins
torch exactly makes pip replace it and the bridge stops loading. The extras give ranges; the tested CPU torch
is pinned for the development set-up only, in scripts/constraints.txt (scripts/setup-env.sh passes it with -c).
pip itself is asked, offline, against stand-in distributions: a dist-info and a wheel holding metadata only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
# Habana's builds, named in the style of its DeepSpeed fork's versions: torch 2.6.0 is docker/Dockerfile's
# default (SynapseAI 1.21), 2.9 ships with 1.23, 2.11 with 1.24.1 (/work/shared/notes/gaudi-stack.md).
HABANA_BUILDS = {
    "torch": ["2.6.0+hpu.synapse.v1.21.3", "2.9.0+hpu.synapse.v1.23.0", "2.11.0+hpu.synapse.v1.24.1"],
    "deepspeed": ["0.16.1+hpu.synapse.v1.22.0"],
}
STAND_IN = "stand-in for tests/unit/test_extras.py: metadata only, no code"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def exact_pins(requirements: list[str], names: set[str]) -> list[str]:
    """The requirements on `names` that allow a single version (== or ===). Pure."""
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.name.lower() in names and any(s.operator in ("==", "===") for s in req.specifier):
            out.append(text)
    return out


def test_no_extra_pins_torch_or_deepspeed_and_each_admits_habanas_builds():
    project = _project()
    groups = {"(base)": project["dependencies"], **project["optional-dependencies"]}
    for extra, requirements in groups.items():
        assert exact_pins(requirements, set(HABANA_BUILDS)) == [], f"[{extra}] pins a Habana-provided package"
        for text in requirements:
            req = Requirement(text)
            for version in HABANA_BUILDS.get(req.name.lower(), []):
                assert req.specifier.contains(version, prereleases=True), f"[{extra}] {text} refuses {version}"


def test_exact_pins_finds_a_pin():
    assert exact_pins(["torch==2.13.0", "Torch===2.1", "torch>=2.6", "numpy==2"], {"torch"}) == [
        "torch==2.13.0",
        "Torch===2.1",
    ]


def _dist_info(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {STAND_IN}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _wheel(links: Path, name: str, version: str) -> None:
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(links / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {STAND_IN}\n"
        )
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


@pytest.fixture(scope="module")
def habana_host(tmp_path_factory):
    """(project copy, environment) where pip sees Habana's torch and DeepSpeed installed and, offline, only a
    stand-in torch 2.13.0 wheel to replace them with."""
    tmp = tmp_path_factory.mktemp("habana_host")
    project = tmp / "project"  # pyproject.toml alone, so that pip's metadata build leaves the tree alone
    (project / "gaudi_launch").mkdir(parents=True)
    shutil.copy(ROOT / "gaudi_launch" / "__init__.py", project / "gaudi_launch")  # the version (pyproject reads it)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project)
    site, links = tmp / "site", tmp / "links"
    links.mkdir()
    _dist_info(site, "torch", HABANA_BUILDS["torch"][1])
    _dist_info(site, "deepspeed", HABANA_BUILDS["deepspeed"][0])
    _wheel(links, "torch", "2.13.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # No pip configuration (this machine's adds wheel directories and constraints); the stand-ins come
    # first on sys.path, so they shadow the venv's own torch and DeepSpeed.
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHONPATH=str(site), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return project, links, env


def _would_install(habana_host, target: str, *extra: str) -> dict[str, str]:
    project, links, env = habana_host
    report = project.parent / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(links)]
    cmd += ["--no-build-isolation", "--quiet", "--report", str(report), *extra, f"{project}[{target}]"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


@pytest.mark.parametrize("extra", ["train", "deepspeed"])
def test_pip_keeps_habanas_torch_and_deepspeed(habana_host, extra):
    assert _would_install(habana_host, extra) == {"gaudi-launch": "0.1.0"}


def test_the_development_constraints_pin_the_tested_cpu_torch(habana_host):
    installs = _would_install(habana_host, "train", "-c", str(ROOT / "scripts" / "constraints.txt"))
    assert installs == {"gaudi-launch": "0.1.0", "torch": "2.13.0"}


def test_setup_env_installs_with_the_constraints_and_reinstalls_when_they_change():
    script = (ROOT / "scripts" / "setup-env.sh").read_text()
    assert "-c scripts/constraints.txt -e '.[dev]'" in script
    assert '[ scripts/constraints.txt -nt "$stamp" ]' in script
