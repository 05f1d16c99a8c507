#!/usr/bin/env bash
# Set up, then run the test suite: everything, or the quick tier with --quick (no slow, cluster or lint
# tests: tests/conftest.py's TIERS), or whatever pytest arguments are given.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# pytest's progress reaches a log as it happens, not in 8 KB blocks lost if the run is stopped.
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest "$@"
