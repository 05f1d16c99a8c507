"""Training efficiency against this machine's own limit: achieved FLOP/s of our Trainer as a share
of a matmul peak measured on the same device, in fp32 and with bf16 autocast.

1. Peak: square matmuls (2·n³ FLOPs each) of a few sizes on the device that
   gaudi_launch.runtime.device.select_device picks (HPU, else CUDA, else CPU; --device forces one),
   in fp32 and bf16; each trial times enough matmuls to last --min-time seconds, and the peak is the
   best trial of the best size (best of --trials).
2. Training: our Trainer on the shipped GPT-2 (--model small|tiny, trained from scratch on the shipped
   corpus), one process, --steps optimizer steps with the first --warmup excluded (the Trainer's own
   throughput figure), fp32 and bf16 autocast, --repeats interleaved runs each (median, min-max).
3. Achieved FLOP/s = 6 x parameters x tokens/s (the usual forward + backward estimate: it leaves out
   the attention score FLOPs and counts the position embeddings, two small terms of opposite sign at
   these sizes), and the MFU-style ratio = achieved / measured peak of the same precision.

    .venv/bin/python scripts/bench/bench_mfu.py [--model small] [--steps 30] [--json out.json]

It is a benchmark, not a test: it prints figures and ratios and never passes or fails on time. The
ratio is against what this device measurably does on a large matmul, not a datasheet number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_launch import cpu_model, environment, environment_line  # noqa: E402  (same directory)

PRECISIONS = ("fp32", "bf16")
LABELS = {"fp32": "fp32", "bf16": "bf16 autocast"}
DEFAULT_SIZES = {"cpu": "256,512,1024,2048", "cuda": "2048,4096,8192", "hpu": "2048,4096,8192"}


def device_name(info) -> str:
    import torch

    if info.kind == "cuda":
        return f"cuda: {torch.cuda.get_device_name(info.device)}"
    if info.kind == "hpu":
        try:
            import habana_frameworks.torch.hpu as hpu

            return f"hpu: {hpu.get_device_name()}"
        except Exception:  # the name is decoration; the measurement does not depend on it
            return "hpu"
    return f"cpu: {cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


# ---------------------------------------------------------------------------------------------
# Peak


def _time_matmuls(info, a, b, count: int) -> float:
    from gaudi_launch.runtime.device import mark_step, synchronize

    synchronize(info)
    t0 = time.perf_counter()
    for _ in range(count):
        c = a @ b
        mark_step(info)  # HPU lazy mode: run each matmul as its own graph (no-op elsewhere)
    synchronize(info)
    del c
    return time.perf_counter() - t0


def matmul_peak(info, dtype_name: str, sizes: list[int], trials: int, min_time: float) -> dict[str, object]:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    per_size: dict[str, float] = {}
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=gen).to(info.device, dtype)
        b = torch.randn(n, n, generator=gen).to(info.device, dtype)
        # Warm-up (kernel selection, JIT, caches), also the calibration of the trial length.
        first = min(_time_matmuls(info, a, b, 1) for _ in range(3))
        count = max(1, math.ceil(min_time / max(first, 1e-9)))
        best = 0.0
        for _ in range(trials):
            seconds = _time_matmuls(info, a, b, count)
            best = max(best, 2.0 * n**3 * count / seconds)
        per_size[str(n)] = best
        del a, b
    size = max(per_size, key=per_size.get)
    return {"flops": per_size[size], "size": int(size), "per_size": per_size}


# ---------------------------------------------------------------------------------------------
# Training


def build(args):
    """Model, dataset and collator as bench_train.py's common() builds them, for --model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gaudi_launch.runtime import data

    texts = data.load_text_files(None, None)
    tokenizer = data.load_tokenizer(None)
    blocks = data.tokenize_and_group(texts["train"], tokenizer, args.block)
    config = AutoConfig.from_pretrained(os.path.join(data.ASSETS, f"{args.model}-gpt2"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    return model, data.BlockDataset(blocks), data.causal_lm_collator


def count_params(model) -> int:
    # Tied input/output embeddings are one tensor: count each parameter once.
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def train_once(args, precision: str) -> dict[str, float]:
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    model, dataset, collator = build(args)
    params = count_params(model)
    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as out:
        targs = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=1e-3,
            logging_steps=10**9,
            save_steps=0,
            device=args.device,
            throughput_warmup_steps=args.warmup,
            bf16=precision == "bf16",
            gaudi_config_name=args.gaudi_config,
        )
        trainer = Trainer(
            model,
            targs,
            train_dataset=dataset,
            data_collator=collator,
            tokens_per_sample=args.block,
            log=lambda s: None,
        )
        m = trainer.train().metrics
        trainer.writer.close()
    tokens = m["train_tokens_per_second"]
    return {
        "tokens_per_s": tokens,
        "samples_per_s": m["train_samples_per_second"],
        "step_ms": 1000.0 / m["train_steps_per_second"] if m["train_steps_per_second"] else float("nan"),
        "params": params,
        "flops": 6.0 * params * tokens,
        "train_loss": m["train_loss"],
    }


# ---------------------------------------------------------------------------------------------


def _unit(peak: float):
    return (1e12, "TFLOP/s") if peak >= 1e12 else (1e9, "GFLOP/s")


def print_tables(res: dict[str, object]) -> None:
    cfg = res["config"]
    peaks, train = res["peak"], res["training"]
    scale, unit = _unit(max(p["flops"] for p in peaks.values()))
    print(f"MFU-style efficiency on {res['device']}")
    print(environment_line(res))
    print(
        f"matmul peak: square n x n, best of {cfg['trials']} trial(s) of >= {cfg['min_time']} s each, "
        f"sizes {cfg['sizes']}"
    )
    print(f"{'dtype':14} {'best n':>6} {'peak ' + unit:>14}   per size")
    for prec in PRECISIONS:
        p = peaks[prec]
        sizes = ", ".join(f"{n}: {v / scale:.3g}" for n, v in p["per_size"].items())
        print(f"{prec:14} {p['size']:6d} {p['flops'] / scale:14.3f}   {sizes}")
    first = next(iter(train.values()))
    print()
    print(
        f"training: {cfg['model']} GPT-2 ({first['params'] / 1e6:.2f} M parameters), our Trainer, 1 process, "
        f"batch {cfg['batch']}x{cfg['block']} tokens, {cfg['steps']} steps, first {cfg['warmup']} excluded, "
        f"{cfg['repeats']} repeat(s) interleaved; achieved = 6 x params x tokens/s"
    )
    print(
        f"{'precision':14} {'tokens/s median':>15} {'min-max':>17} {'step ms':>8} {'achieved ' + unit:>18} "
        f"{'peak ' + unit:>14} {'MFU':>7}"
    )
    for prec in PRECISIONS:
        t = train[prec]
        print(
            f"{LABELS[prec]:14} {t['tokens_per_s']:15.0f} {t['tokens_min']:8.0f}-{t['tokens_max']:<8.0f} "
            f"{t['step_ms']:8.1f} {t['flops'] / scale:18.3f} {peaks[prec]['flops'] / scale:14.3f} "
            f"{100 * t['mfu']:6.1f}%"
        )
    f32, b16 = train["fp32"], train["bf16"]
    print(
        f"bf16 autocast vs fp32: {b16['tokens_per_s'] / f32['tokens_per_s']:.2f}x tokens/s; "
        f"bf16 matmul peak vs fp32: {peaks['bf16']['flops'] / peaks['fp32']['flops']:.2f}x"
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["hpu", "cuda", "cpu"], default=None, help="default: as select_device picks")
    p.add_argument("--sizes", default=None, help="matmul sizes, comma-separated (default: by device)")
    p.add_argument("--trials", type=int, default=5, help="best of this many timed trials per size")
    p.add_argument("--min-time", type=float, default=0.25, help="seconds each trial lasts at least")
    p.add_argument("--model", choices=["small", "tiny"], default="small", help="shipped GPT-2 config")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="training runs per precision, interleaved")
    p.add_argument("--gaudi-config", default="Habana/gpt2", help="gaudi config for the Trainer")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.steps <= args.warmup or args.trials < 1 or args.repeats < 1:
        p.error("need --steps > --warmup, --trials >= 1, --repeats >= 1")

    from gaudi_launch.runtime.device import select_device

    info = select_device(force=args.device)
    args.device = info.kind
    args.sizes = args.sizes or DEFAULT_SIZES[info.kind]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    res: dict[str, object] = {
        "bench": "mfu",
        **environment(device_name(info)),
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "peak": {},
        "training": {},
    }
    for prec in PRECISIONS:
        print(f"matmul peak {prec} ...", file=sys.stderr, flush=True)
        res["peak"][prec] = matmul_peak(info, prec, sizes, args.trials, args.min_time)
    runs: dict[str, list[dict[str, float]]] = {prec: [] for prec in PRECISIONS}
    for r in range(args.repeats):  # interleaved, so machine noise hits both precisions alike
        for prec in PRECISIONS:
            print(f"training {prec}, run {r + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
            runs[prec].append(train_once(args, prec))
    for prec in PRECISIONS:
        toks = [x["tokens_per_s"] for x in runs[prec]]
        med = statistics.median(toks)
        params = runs[prec][0]["params"]
        flops = 6.0 * params * med
        res["training"][prec] = {
            "tokens_per_s": med,
            "tokens_per_s_runs": toks,
            "tokens_min": min(toks),
            "tokens_max": max(toks),
            "samples_per_s": statistics.median(x["samples_per_s"] for x in runs[prec]),
            "step_ms": statistics.median(x["step_ms"] for x in runs[prec]),
            "params": params,
            "flops": flops,
            "peak_flops": res["peak"][prec]["flops"],
            "mfu": flops / res["peak"][prec]["flops"],
        }
    print_tables(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
