"""The guide's benchmark table for the seed's workloads, on whatever this machine has: per workload and
batch size per device, samples/s with the warm-up steps excluded, our runtime (fast_ddp) beside
transformers' Trainer (DDP) on the same tiny model, data, batch, steps and ranks, run interleaved.

    .venv/bin/python scripts/bench/bench_seed.py [--steps 30] [--warmup 5] [--repeats 1] [--torch_compile]
        [--json out.json]

The guide's own figures (BERT-Large phase 1, 8 devices: Gaudi2 1580.2 / 1835.8 samples/s at batch
32 / 64, A100 981.6 / 1082.6) are printed beside ours for reference: different hardware and models,
not a comparison. The "plain loop" column is the same model's forward, backward and fused AdamW with
torch's DDP and no trainer at all (each batch collated on the hot path), and "plain/hf" its ratio to
transformers' Trainer: the model's own step under DDP (not a floor: DDP's waits cost more than a
trainer's work on a shared CPU). --torch_compile adds a column: our runtime with its --torch_compile
(the model compiled by inductor at the first step, which is warm-up, so its compile time is not in
the figure; transformers' Trainer stays as it is). BERT's rows add "every position": our runtime
with the masked-LM head on every position (--mlm_head_masked_only false), as transformers' model
computes it, so what the masked-only head gives shows apart from the rest. It is a benchmark, not a test: it never passes or
fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_launch import environment, environment_line  # noqa: E402  (same directory)
from bench_train import run_config  # noqa: E402

# (workload, model, batch sizes per device, tokens per sample): the guide's BERT batches, T5 as fine-tuned.
WORKLOADS = [
    ("clm", "tiny GPT-2 (causal LM)", [8], 64),
    ("mlm", "tiny BERT (masked LM, phase-1 style)", [32, 64], 64),
    ("t5", "tiny T5 (summarization)", [8], 128),
]
GUIDE = {
    ("mlm", 32): "Gaudi2 1580.2, A100 981.6 (BERT-Large, 8 devices)",
    ("mlm", 64): "Gaudi2 1835.8, A100 1082.6 (BERT-Large, 8 devices)",
}
SIDES = [
    ("ours", ["--role", "ours", "--strategy", "fast_ddp"]),
    ("transformers", ["--role", "hf"]),
    ("plain loop", ["--role", "bare"]),
]  # the model's own step under torch DDP, no trainer
COMPILED = ("ours, compiled", ["--role", "ours", "--strategy", "fast_ddp", "--torch_compile"])
# BERT only: our runtime with the masked-LM head on every position, as transformers' model runs it.
EVERY = ("ours, head on every position", ["--role", "ours", "--strategy", "fast_ddp", "--every_position"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--workloads", default="clm,mlm,t5")
    p.add_argument("--batch-scale", type=float, default=1.0, help="scale the batch sizes (a quick run: 0.25)")
    p.add_argument(
        "--torch_compile", action="store_true", help="also our runtime with --torch_compile (a column of its own)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    sides = SIDES + [COMPILED] if args.torch_compile else SIDES
    env = environment()
    chosen = [w for w in WORKLOADS if w[0] in args.workloads.split(",")]
    runs = {}
    for _ in range(args.repeats):  # interleaved: machine noise hits every configuration alike
        for workload, _, batches, block in chosen:
            for batch in batches:
                for side, extra in sides + ([EVERY] if workload == "mlm" else []):
                    cfg = argparse.Namespace(
                        ranks=args.ranks,
                        steps=args.steps,
                        warmup=args.warmup,
                        block=block,
                        batch=max(1, int(batch * args.batch_scale)),
                        workload=workload,
                    )
                    runs.setdefault((workload, batch, side), []).append(run_config(extra, cfg)["samples_per_s"])
    print(
        f"seed workloads: {args.ranks} ranks on {env['device']}, {args.steps} steps, first {args.warmup} "
        f"excluded, {args.repeats} repeat(s), samples/s median"
    )
    print(environment_line(env))
    compiled_head = f" {'compiled':>9} {'ratio':>6}" if args.torch_compile else ""
    print(
        f"{'workload':38} {'batch/device':>12} {'devices':>7} {'ours':>9} {'transformers':>12} {'ratio':>6} "
        f"{'plain loop':>10} {'plain/hf':>8}{compiled_head} {'every position':>16}  guide"
    )
    rows = []
    for workload, name, batches, block in chosen:
        for batch in batches:
            ours = statistics.median(runs[(workload, batch, "ours")])
            hf = statistics.median(runs[(workload, batch, "transformers")])
            bare = statistics.median(runs[(workload, batch, "plain loop")])
            used = max(1, int(batch * args.batch_scale))
            row = {
                "workload": workload,
                "model": name,
                "batch_per_device": used,
                "devices": args.ranks,
                "tokens_per_sample": block,
                "ours_samples_per_s": ours,
                "transformers_samples_per_s": hf,
                "ratio": ours / hf,
                "plain_loop_samples_per_s": bare,
                "plain_ratio": bare / hf,
                "guide": GUIDE.get((workload, batch), ""),
                "runs": {side: runs[(workload, batch, side)] for side, _ in sides},
            }
            compiled = ""
            if args.torch_compile:
                row["ours_compiled_samples_per_s"] = statistics.median(runs[(workload, batch, COMPILED[0])])
                row["compiled_ratio"] = row["ours_compiled_samples_per_s"] / hf
                compiled = f" {row['ours_compiled_samples_per_s']:9.1f} {row['compiled_ratio']:5.2f}x"
            every = "-"
            if workload == "mlm":
                row["ours_every_position_samples_per_s"] = statistics.median(runs[(workload, batch, EVERY[0])])
                row["every_position_ratio"] = row["ours_every_position_samples_per_s"] / hf
                row["runs"][EVERY[0]] = runs[(workload, batch, EVERY[0])]
                every = f"{row['ours_every_position_samples_per_s']:.1f} ({row['every_position_ratio']:.2f}x)"
            rows.append(row)
            print(
                f"{name:38} {used:12d} {args.ranks:7d} {ours:9.1f} {hf:12.1f} {ours / hf:5.2f}x "
                f"{bare:10.1f} {bare / hf:7.2f}x{compiled} {every:>16}  {GUIDE.get((workload, batch), '')}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "seed", "config": vars(args), "environment": env, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
