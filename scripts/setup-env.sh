#!/usr/bin/env bash
# Idempotent set-up of everything the demo and the tests need on a fresh Debian machine:
# the virtual environment in .venv with gaudi-launch (editable) and its test/training extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned (the CPU wheel this project is tested with); a loose pin would pull CUDA builds.
stamp=.venv/.gaudi-launch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import gaudi_launch, torch, pytest, hypothesis" >/dev/null
  touch "$stamp"
fi
