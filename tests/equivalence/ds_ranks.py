"""The ranks of test_vs_deepspeed.py's one 2-rank launch: DeepSpeed's own engine in a plain loop against
our Trainer under --deepspeed, on the shipped tiny GPT-2, fp32, ZeRO stages 1, 2 and 3.

The reference drives the engine as accelerate 1.15 does for transformers' Trainer
(DeepSpeedEngineWrapper.backward): set_gradient_accumulation_boundary before each backward, the loss
divided by the step's micro-batches with scale_wrt_gas=False (Trainer.training_step), engine.step() at
the boundary only; an epoch's leftover micro-batches make a short step (Trainer._run_epoch). Both sides
take DeepSpeed's optimizer and scheduler blocks, the same model, data order and seed.

Scenarios, each on both ranks, recorded (errors too) so that one failure leaves the others' results:
  zero{1,2,3}/reference  the plain loop, 2N steps
  zero{1,2,3}/ours       our Trainer, 2N steps, a checkpoint at N (mid-epoch) and 2N
  zero{1,2,3}/resumed    a fresh Trainer and model (another seed) in another output_dir holding a copy of
                         that checkpoint-N only, resumed with "latest" (what --max-restarts does) to 2N
  zero2-own/{ours,resumed}  optimum-habana's config style: no optimizer or scheduler block (ours go in)
  zero2/hf               transformers' own Trainer with TrainingArguments(deepspeed=<ZeRO-2 dict>), the
                         config ours gets ("auto" filled from the same flags), through accelerate, 2N steps
  zero3/clm              scripts/run_clm.py's main() under ZeRO-3 (it saves the model, then evaluates),
                         first, before anything else has started DeepSpeed in the process
Rank 0 writes them to argv[1]/results.json.

Run: python -m gaudi_launch --num_devices 2 tests/equivalence/ds_ranks.py OUT_DIR
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import sys
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig  # noqa: E402
from transformers.integrations.deepspeed import unset_hf_deepspeed_config  # noqa: E402

from gaudi_launch.runtime import data  # noqa: E402
from gaudi_launch.runtime.args import TrainingArguments  # noqa: E402
from gaudi_launch.runtime.sampling import DealtBatches  # noqa: E402
from gaudi_launch.runtime.trainer import Trainer, set_seed  # noqa: E402
from gaudi_launch.runtime.zero_init import prepare_deepspeed  # noqa: E402

SEED, BATCH, ACCUM, BLOCK = 7, 2, 3, 32
TRAIN_BLOCKS = 28  # 14 a rank, 7 micro-batches an epoch: steps of 3, 3 and a short 1
EVAL_BLOCKS = 8
N = 4  # a checkpoint at N (epoch 1's first step), resumed to 2N
LR = 3e-3
DECAY, WARMUP = 0.01, 2
CLM_EVAL_SAMPLES = 8


def ds_config(stage: int, blocks: bool = True, auto: bool = False) -> dict:
    """The reference's config has its sizes written out; ours leave them "auto" (optimum-habana's
    configs do), for the Trainer to fill."""
    zero: dict = {"stage": stage}
    if stage == 3:
        # Every parameter partitioned (by default a tiny model's stay whole on every rank), and
        # gathered whole for save_model.
        zero["stage3_param_persistence_threshold"] = 0
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config = {
        "train_batch_size": "auto" if auto else BATCH * ACCUM * dist.get_world_size(),
        "train_micro_batch_size_per_gpu": "auto" if auto else BATCH,
        "gradient_accumulation_steps": "auto" if auto else ACCUM,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10**6,
    }
    if blocks:
        # Ours: the flags' values as "auto" (a written value that contradicts a flag is refused).
        lr, decay, warm, total = ("auto",) * 4 if auto else (LR, DECAY, WARMUP, 2 * N)
        config["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": decay, "torch_adam": True}}
        config["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": lr, "warmup_num_steps": warm, "total_num_steps": total},
        }
    return config


def datasets():
    tok = data.load_tokenizer()
    texts = data.load_text_files(None, None)
    train = data.BlockDataset(data.tokenize_and_group(texts["train"], tok, BLOCK)[:TRAIN_BLOCKS])
    evals = data.BlockDataset(data.tokenize_and_group(texts["validation"], tok, BLOCK)[:EVAL_BLOCKS])
    return tok, train, evals


def build_model(vocab: int, seed: int):
    set_seed(seed)
    config = AutoConfig.from_pretrained(data.TINY_GPT2_DIR)
    config.vocab_size = vocab
    model = AutoModelForCausalLM.from_config(config)
    model.loss_type = "ForCausalLM"
    return model


def partitioned(model) -> bool:
    """Built under zero.Init: every parameter is a ZeRO-3 partition, none holds its whole tensor here."""
    return all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters())


class Recorder:
    """The raw loss of every training micro-batch, from a forward hook: what each side computed,
    whatever its loop then does with it."""

    def __init__(self, model):
        self.micro: list[float] = []
        self.steps: list[list[float]] = []
        model.register_forward_hook(self._hook)

    def _hook(self, module, args, out) -> None:
        if module.training:
            self.micro.append(float(out.loss.detach()))

    def step_done(self) -> None:
        self.steps.append(self.micro)
        self.micro = []


def reference(stage: int, train, vocab: int) -> dict:
    config = ds_config(stage)
    keep = HfDeepSpeedConfig(config)  # as transformers' TrainingArguments: ZeRO-3 builds under zero.Init
    model = build_model(vocab, SEED)
    rec = Recorder(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    # transformers' order and sharding (accelerate's seedable sampler, batches dealt to the ranks in
    # turn), which sampling.py implements and tests/equivalence checks against transformers' Trainer.
    sampler = DealtBatches(len(train), BATCH, dist.get_world_size(), dist.get_rank(), seed=SEED)
    loader = DataLoader(train, batch_sampler=sampler, collate_fn=data.causal_lm_collator)
    epoch, global_steps = 0, []
    while len(rec.steps) < 2 * N:
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), ACCUM):
            group = batches[start : start + ACCUM]
            for i, batch in enumerate(group):
                engine.set_gradient_accumulation_boundary(i == len(group) - 1)
                loss = engine(**batch).loss
                engine.backward(loss / len(group), scale_wrt_gas=False)
            engine.step()
            rec.step_done()
            global_steps.append(engine.global_steps)
            if len(rec.steps) == 2 * N:
                break
        epoch += 1
    del keep
    return {"steps": rec.steps, "global_steps": global_steps}


def ours(name: str, config: dict, train, evals, vocab: int, out: str, resume: bool = False) -> dict:
    path = os.path.join(out, f"{name}-config.json")
    run_dir = os.path.join(out, name + ("-resumed" if resume else ""))
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(config, f)
        if resume:  # only checkpoint-N there: "latest" must find and load a DeepSpeed checkpoint
            shutil.copytree(os.path.join(out, name, f"checkpoint-{N}"), os.path.join(run_dir, f"checkpoint-{N}"))
    dist.barrier()
    args = TrainingArguments(
        output_dir=run_dir,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        max_steps=2 * N,
        save_steps=N,
        logging_steps=1,
        learning_rate=LR,
        weight_decay=DECAY,
        warmup_steps=WARMUP,
        seed=SEED,
        device="cpu",
        deepspeed=path,
        fused_kernels=False,  # the model exactly as the reference runs it
        resume_from_checkpoint="latest" if resume else None,
    )
    prepare_deepspeed(args)  # as the shipped scripts do before building their model
    model = build_model(vocab, SEED + 1 if resume else SEED)  # resumed: only the checkpoint gives it weights
    built_partitioned = partitioned(model)
    rec = Recorder(model)
    global_steps: list[int] = []

    def on_step(step: int) -> None:
        rec.step_done()
        global_steps.append(trainer.engine.global_steps)

    trainer = Trainer(
        model,
        args,
        train_dataset=train,
        eval_dataset=evals,
        data_collator=data.causal_lm_collator,
        log=lambda s: None,
        on_step_end=on_step,
    )
    result = trainer.train()
    res = {"steps": rec.steps, "global_steps": global_steps, "step": result.global_step}
    res["built_partitioned"] = built_partitioned
    saved = os.path.join(run_dir, f"checkpoint-{N}")
    res["checkpoint"] = sorted(os.listdir(saved))
    res["shards"] = sorted(os.listdir(os.path.join(saved, "deepspeed"))) if "deepspeed" in res["checkpoint"] else []
    return res


def hf_trainer(config: dict, train, vocab: int, out: str) -> dict:
    """transformers' Trainer itself under DeepSpeed (accelerate's DeepSpeed path), same flags as ours."""
    from transformers import Trainer as HfTrainer
    from transformers import TrainerCallback
    from transformers import TrainingArguments as HfArguments

    args = HfArguments(
        output_dir=os.path.join(out, "zero2-hf"),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        max_steps=2 * N,
        logging_steps=1,
        learning_rate=LR,
        weight_decay=DECAY,
        warmup_steps=WARMUP,
        seed=SEED,
        deepspeed=json.loads(json.dumps(config)),  # a copy: transformers fills its "auto" values in place
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        dataloader_pin_memory=False,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    model = build_model(vocab, SEED)
    rec = Recorder(model)
    global_steps: list[int] = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            rec.step_done()
            global_steps.append(trainer.model_wrapped.global_steps)

    trainer = HfTrainer(
        model=model, args=args, train_dataset=train, data_collator=data.causal_lm_collator, callbacks=[Steps()]
    )
    result = trainer.train()
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"steps": rec.steps, "global_steps": global_steps, "step": result.global_step, "logged": logged}


def run_clm(out: str) -> dict:
    """The shipped script end to end under ZeRO-3; any warning it raises is recorded."""
    path = os.path.join(out, "clm-zero3.json")
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(ds_config(3, auto=True), f)
    dist.barrier()
    spec = importlib.util.spec_from_file_location("run_clm", os.path.join(ROOT, "scripts", "run_clm.py"))
    script = importlib.util.module_from_spec(spec)
    sys.modules["run_clm"] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    argv = ["--do_train", "--do_eval", "--output_dir", os.path.join(out, "clm"), "--deepspeed", path]
    argv += ["--per_device_train_batch_size", str(BATCH), "--gradient_accumulation_steps", str(ACCUM)]
    argv += ["--max_steps", "3", "--block_size", str(BLOCK), "--max_train_samples", str(TRAIN_BLOCKS)]
    argv += ["--max_eval_samples", str(CLM_EVAL_SAMPLES), "--device", "cpu", "--logging_steps", "1"]
    argv += ["--learning_rate", str(LR), "--weight_decay", str(DECAY), "--warmup_steps", str(WARMUP)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert script.main(argv) == 0
    return {"warnings": [str(w.message) for w in caught if "ZeRO-3" in str(w.message)]}


def gathered(value):
    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, value)
    return box


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    tok, train, evals = datasets()
    vocab = len(tok)
    # The script first, in a process where nothing has started DeepSpeed yet (as in a real run).
    scenarios = [("zero3/clm", lambda: run_clm(out))]
    for stage in (1, 2, 3):
        name, config = f"zero{stage}", ds_config(stage, auto=True)
        scenarios += [
            (f"{name}/reference", lambda stage=stage: reference(stage, train, vocab)),
            (f"{name}/ours", lambda n=name, c=config: ours(n, c, train, evals, vocab, out)),
            (f"{name}/resumed", lambda n=name, c=config: ours(n, c, train, evals, vocab, out, resume=True)),
        ]
    scenarios.append(("zero2/hf", lambda: hf_trainer(ds_config(2, auto=True), train, vocab, out)))
    own = ds_config(2, blocks=False, auto=True)
    scenarios += [
        ("zero2-own/ours", lambda: ours("zero2-own", own, train, evals, vocab, out)),
        ("zero2-own/resumed", lambda: ours("zero2-own", own, train, evals, vocab, out, resume=True)),
    ]
    results: dict = {"constants": {"N": N, "BLOCK": BLOCK, "CLM_EVAL_SAMPLES": CLM_EVAL_SAMPLES}}
    for key, run in scenarios:
        try:
            res = run()
        except Exception as exc:
            res = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
        results[key] = gathered(res)
        unset_hf_deepspeed_config()  # the next scenario registers its own
        gc.collect()
    if dist.get_rank() == 0:
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()


if __name__ == "__main__":
    main()
