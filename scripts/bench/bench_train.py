"""Training throughput, side by side in one invocation: our Trainer (fast_ddp and DDP) against
transformers' Trainer, same tiny model (GPT-2; --workload mlm: BERT, t5: T5), data, batch, steps and 2 CPU ranks, warm-up excluded the
same way (the clock starts after --warmup optimizer steps). Prints a table and writes JSON.

    .venv/bin/python scripts/bench/bench_train.py [--steps 40] [--warmup 5] [--repeats 1] [--json out.json]

It is a benchmark, not a test: it prints figures and ratios and never passes or fails on time.
Each rank runs this same file with --role; the driver starts them through gaudi-launch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_launch import environment, environment_line  # noqa: E402  (same directory)

RESULT = "BENCH-RESULT "


def common(args):
    """(model, dataset, collator) of the workload: the seed's causal LM (tiny GPT-2), BERT masked-LM
    pre-training (tiny BERT) or T5 summarization (tiny T5), from the shipped corpus."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    from gaudi_launch.runtime import data, mlm, summarization

    texts = data.load_text_files(None, None)
    tokenizer = data.load_tokenizer(None)
    torch.manual_seed(0)
    workload = getattr(args, "workload", "clm")
    if workload == "t5":
        pairs = summarization.fable_pairs(texts["train"])
        encoded = summarization.encode_pairs(pairs, tokenizer, args.block, 32)
        config = AutoConfig.from_pretrained(os.path.join(data.ASSETS, "tiny-t5"))
        # fixed shapes: every batch costs the same, as on a device that compiles per shape
        return (
            AutoModelForSeq2SeqLM.from_config(config),
            summarization.ListDataset(encoded),
            summarization.Seq2SeqCollator(tokenizer.pad_token_id, args.block, 32),
        )
    blocks = data.tokenize_and_group(texts["train"], tokenizer, args.block)
    if workload == "mlm":
        mask_id = mlm.add_mask_token(tokenizer)
        config = AutoConfig.from_pretrained(os.path.join(data.ASSETS, "tiny-bert"))
        config.vocab_size = len(tokenizer)
        return (
            AutoModelForMaskedLM.from_config(config),
            data.BlockDataset(blocks),
            mlm.MLMCollator(mask_id, len(tokenizer), 0.15, [tokenizer.pad_token_id]),
        )
    config = AutoConfig.from_pretrained(os.path.join(data.ASSETS, "tiny-gpt2"))
    model = AutoModelForCausalLM.from_config(config)
    # As run_clm.py: transformers 5 warns on every forward otherwise (and under torch.compile the
    # warning's logging call breaks the graph in three).
    model.loss_type = "ForCausalLM"
    return model, data.BlockDataset(blocks), data.causal_lm_collator


def role_ours(args) -> dict:
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    model, dataset, collator = common(args)
    targs = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=10**9,
        save_steps=0,
        device="cpu",
        distribution_strategy=args.strategy,
        throughput_warmup_steps=args.warmup,
        torch_compile=args.torch_compile,
        mlm_head_masked_only=not args.every_position,
    )
    trainer = Trainer(
        model, targs, train_dataset=dataset, data_collator=collator, tokens_per_sample=args.block, log=lambda s: None
    )
    m = trainer.train().metrics
    return {
        "samples_per_s": m["train_samples_per_second"],
        "tokens_per_s": m["train_tokens_per_second"],
        "step_s": 1.0 / m["train_steps_per_second"] if m["train_steps_per_second"] else float("nan"),
    }


def role_hf(args) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model, dataset, collator = common(args)
    marks = {}

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                marks["start"] = time.perf_counter()
            marks["end"] = time.perf_counter()

    targs = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=10**9,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collator, callbacks=[Clock()]).train()
    measured = args.steps - args.warmup
    seconds = marks["end"] - marks["start"]
    samples = measured * args.batch * int(os.environ.get("WORLD_SIZE", "1"))
    return {
        "samples_per_s": samples / seconds,
        "tokens_per_s": samples * args.block / seconds,
        "step_s": seconds / measured,
    }


def role_bare(args) -> dict:
    """The model's forward, backward and fused AdamW (the kernel both trainers use) in a plain loop
    with torch's DDP for the gradient all-reduce, and nothing else (no logging, metrics, clipping,
    checkpoints): what the model's own step costs under DDP, beside which a trainer's overheads
    show. Not a floor: DDP's own waits (a buffer broadcast in every forward for models with buffers,
    BERT's position ids; a sleeping wait for the all-reduce) cost more than a trainer's work here."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model, dataset, collator = common(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sampler = None
    if world > 1:
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(
        dataset, batch_size=args.batch, sampler=sampler, shuffle=sampler is None, collate_fn=collator, drop_last=True
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # both trainers' AdamW kernel
    model.train()
    step, start, epoch = 0, None, 0
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.warmup:
                start = time.perf_counter()
            if step >= args.steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    measured = args.steps - args.warmup
    samples = measured * args.batch * world
    if world > 1:
        # DDP's reducer must not outlive the group: dropped after destroy_process_group, it frees the
        # group holding the GIL while gloo's worker thread needs it to free its last work (deadlock).
        del model
        dist.destroy_process_group()
    return {
        "samples_per_s": samples / seconds,
        "tokens_per_s": samples * args.block / seconds,
        "step_s": seconds / measured,
    }


CONFIGS = [
    ("gaudi-launch Trainer, fast_ddp", ["--role", "ours", "--strategy", "fast_ddp"]),
    ("gaudi-launch Trainer, DDP", ["--role", "ours", "--strategy", "ddp"]),
    ("transformers Trainer, DDP", ["--role", "hf"]),
    ("plain loop, DDP (no trainer)", ["--role", "bare"]),
]


def run_config(extra, args) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--num_devices",
            str(args.ranks),
            os.path.abspath(__file__),
            *extra,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
            "--block",
            str(args.block),
            "--out",
            out,
            "--workload",
            getattr(args, "workload", "clm"),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    for line in res.stdout.splitlines():
        if RESULT in line:
            return json.loads(line.split(RESULT, 1)[1])
    raise SystemExit(f"a benchmark run failed (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")


def drive(args) -> None:
    env = environment()
    runs = {name: [] for name, _ in CONFIGS}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every configuration alike
        for name, extra in CONFIGS:
            runs[name].append(run_config(extra, args))
    base = statistics.median(r["samples_per_s"] for r in runs["transformers Trainer, DDP"])
    print(
        f"training throughput: tiny {args.workload}, {args.ranks} CPU ranks (gloo), batch {args.batch}x{args.block} tokens "
        f"per rank, {args.steps} steps, first {args.warmup} excluded, {args.repeats} repeat(s); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(environment_line(env))
    print(f"{'configuration':34} {'samples/s median':>16} {'min-max':>15} {'step ms':>8} {'vs transformers':>16}")
    table = {}
    for name, _ in CONFIGS:
        sps = [r["samples_per_s"] for r in runs[name]]
        med = statistics.median(sps)
        step_ms = 1000 * statistics.median(r["step_s"] for r in runs[name])
        table[name] = {"samples_per_s": sps, "median": med, "step_ms": step_ms, "ratio": med / base}
        print(f"{name:34} {med:16.1f} {min(sps):7.1f}-{max(sps):<7.1f} {step_ms:8.1f} {med / base:15.2f}x")
    fd, dd = table["gaudi-launch Trainer, fast_ddp"], table["gaudi-launch Trainer, DDP"]
    print(
        f"fast_ddp vs DDP step time: {fd['step_ms']:.1f} ms vs {dd['step_ms']:.1f} ms "
        f"({dd['step_ms'] / fd['step_ms']:.2f}x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "environment": env, "results": table}, f, indent=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["ours", "hf", "bare"])
    p.add_argument("--strategy", default="fast_ddp")
    p.add_argument("--workload", choices=["clm", "mlm", "t5"], default="clm")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--torch_compile", action="store_true", help="--role ours: the runtime's --torch_compile")
    p.add_argument(
        "--every_position",
        action="store_true",
        help="--role ours: BERT's masked-LM head on every position (the runtime's --mlm_head_masked_only false)",
    )
    p.add_argument("--out", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.role is None:
        drive(args)
        return
    result = {"ours": role_ours, "hf": role_hf, "bare": role_bare}[args.role](args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
