#!/usr/bin/env bash
# Set up, then run the test suite: everything, or the quick tier with --quick (no slow, cluster or lint
# tests: tests/conftest.py's TIERS), or whatever pytest arguments are given.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python -m pytest "$@"
