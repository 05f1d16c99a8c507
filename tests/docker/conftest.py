"""Fixtures of the Docker image tests: a Docker engine (dockerd started here when none answers, and
stopped after), the stand-in for Habana's base image (scripts/docker-standin-base.sh, kept between runs)
and the project's image built from docker/Dockerfile once per session (removed after)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
import uuid

import pytest

from tests.helpers import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDIN_BASE = os.path.join(ROOT, "scripts", "docker-standin-base.sh")
TOOLS = ("docker", "dockerd", "debootstrap", "ssh-keygen")


def docker(*argv: str, timeout: float = 120, check: bool = False, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(argv)} -> {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return r


def docker_missing() -> list:
    missing = [] if os.geteuid() == 0 else ["root (dockerd, debootstrap)"]
    return missing + [t for t in TOOLS if shutil.which(t) is None]


def require_docker_support() -> None:
    """Skip when not root outside CI, as the other root-needing tests do; fail otherwise (CI=true, or
    root without the tools): these tests must never be skipped there."""
    missing = docker_missing()
    if not missing:
        return
    reason = "the Docker image tests need: " + ", ".join(missing)
    if any(not m.startswith("root") for m in missing):
        reason += " (install them with scripts/install-system-deps.sh as root)"
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip(reason)
    pytest.fail(reason, pytrace=False)


def engine_answers() -> bool:
    try:
        return docker("version", "--format", "{{.Server.Version}}", timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    """The engine `docker` talks to: the running one, else a dockerd started here (stopped at the end).

    Started without its iptables and ip_forward set-up: by default dockerd sets the FORWARD policy to
    DROP, and with br_netfilter loaded that drops the bridged traffic of tests/cluster's namespace hosts.
    Nothing here needs it: the tests' containers talk only to each other on one bridge, and builds use the
    host's network."""
    require_docker_support()
    if engine_answers():
        yield None
        return
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip-forward=false", "--bridge=none"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        up = wait_for(lambda: proc.poll() is not None or engine_answers(), timeout=60, interval=0.5)
        if not up or proc.poll() is not None:
            pytest.fail(
                f"dockerd did not start (exit status {proc.poll()}); the last of {log}:\n{log.read_text()[-3000:]}",
                pytrace=False,
            )
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@dataclasses.dataclass
class Image:
    tag: str
    base: str  # the stand-in base's tag, the Dockerfile's FROM
    base_s: float  # seconds for scripts/docker-standin-base.sh (debootstrap only when not kept)
    build_s: float  # seconds for docker build -f docker/Dockerfile


@pytest.fixture(scope="session")
def image(docker_engine):
    """docker/Dockerfile built on the stand-in base as a user would (EFA=0: EFA=1 needs AWS's installer
    and GitHub, which are not reachable here). The base stays for the next run; this tag goes."""
    t0 = time.monotonic()
    r = subprocess.run(["bash", STANDIN_BASE], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip(), f"{STANDIN_BASE} failed:\n{r.stderr[-3000:]}"
    base = r.stdout.strip().splitlines()[-1]
    t1 = time.monotonic()
    tag = f"gaudi-launch-test:{uuid.uuid4().hex[:8]}"
    build = ["build", "-q", "--network", "host", "-f", "docker/Dockerfile", "-t", tag]
    build += ["--build-arg", "HABANA_REGISTRY=localhost", "--build-arg", "EFA=0", "."]
    try:
        docker(*build, timeout=900, check=True)
        yield Image(tag, base, t1 - t0, time.monotonic() - t1)
    finally:
        # a container left by a test that timed out (its `docker run` client killed) would keep the tag
        left = docker("ps", "-aq", "--filter", f"ancestor={tag}").stdout.split()
        if left:
            docker("rm", "--force", "--volumes", *left, timeout=120)
        docker("rmi", tag, timeout=120)
    assert docker("image", "inspect", tag).returncode != 0, f"image {tag} is still there"
