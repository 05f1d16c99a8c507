#!/usr/bin/env bash
# Idempotent set-up of everything the demo and the tests need on a fresh Debian machine:
# the system tools of the multi-host test cluster (as root: sshd, OpenMPI, pdsh) and the virtual
# environment in .venv with gaudi-launch (editable) and its [dev] extra.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
  bash scripts/install-system-deps.sh >/dev/null
else
  bash scripts/install-system-deps.sh >/dev/null 2>&1 || echo "setup-env: not root: the multi-host tests will be skipped" >&2
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned (the CPU wheel this project is tested with); a loose pin would pull CUDA builds.
# DS_BUILD_OPS=0: DeepSpeed installs as pure Python, no CUDA toolchain needed.
stamp=.venv/.gaudi-launch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 \
    | grep -v "is ignored" || true
  .venv/bin/python -c "import gaudi_launch, torch, pytest, hypothesis, deepspeed" >/dev/null 2>&1 \
    || { echo "setup-env: the install is incomplete (see pip's output above)" >&2; exit 1; }
  touch "$stamp"
fi
# optimum-habana's own source, read (never imported) by the tests that check flag compatibility;
# its dependencies would pin another transformers, so only the wheel is fetched.
peer=.venv/peers/optimum_habana-1.21.2-py3-none-any.whl
if [ ! -f "$peer" ]; then
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps optimum-habana==1.21.2 \
    -d .venv/peers 2>&1 | grep -v "is ignored" || true
fi
