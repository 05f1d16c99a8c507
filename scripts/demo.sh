#!/usr/bin/env bash
# The main job on this machine: set up, then a real 2-rank torch.distributed (gloo) job on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/gaudi-launch --num_devices "${NUM_DEVICES:-2}" --log-dir runs/demo scripts/allreduce_smoke.py "$@"
