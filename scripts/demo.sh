#!/usr/bin/env bash
# The main job on this machine: set up, then train the shipped tiny GPT-2 with run_clm (the seed's
# causal-LM example and flags) on 2 CPU ranks through gaudi-launch: loss falls, eval perplexity
# drops, throughput (warm-up excluded) and memory are logged. Extra arguments go to run_clm.py.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_SYSTEM_DEPS="${SKIP_SYSTEM_DEPS:-1}" bash scripts/setup-env.sh  # the demo needs no cluster tools
exec .venv/bin/gaudi-launch --num_devices "${NUM_DEVICES:-2}" --device "${DEVICE:-cpu}" --log-dir runs/demo/logs \
  scripts/run_clm.py --model_name_or_path gpt2-xl --gaudi_config_name Habana/gpt2 \
  --do_train --do_eval --output_dir runs/demo --overwrite_output_dir \
  --learning_rate 4e-03 --per_device_train_batch_size 8 --gradient_checkpointing \
  --num_train_epochs 3 --use_habana --use_lazy_mode --throughput_warmup_steps 3 \
  --distribution_strategy fast_ddp --logging_steps 10 "$@"
