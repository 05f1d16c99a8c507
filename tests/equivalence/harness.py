"""One process (one rank) of the differential run: our Trainer and transformers' Trainer on the same model,
data, seed and flags, one after the other in the same job (1 rank, or 2 ranks under gaudi-launch).

    python tests/equivalence/harness.py INIT_DIR OUT_DIR          # 1 rank
    python -m gaudi_launch --num_devices 2 tests/equivalence/harness.py INIT_DIR OUT_DIR

INIT_DIR holds the initial weights (written once by ``save_initial_weights``, loaded by both trainers).
Each rank writes OUT_DIR/rank<R>.json: per case and trainer, the logged per-step losses, grad norms and
learning rates, the eval losses, the optimizer step count, the training-set indices it read in order, and
the largest per-tensor difference between the two trainers' final weights.

fp32 unless a case says bf16. Dropout is 0 in the shipped configs; the GPT-2 "dropout" case sets 0.1: both
trainers' loaders then draw their seeds from the global RNG in the same order, so dropout's masks agree.
BERT's training set is masked once (run_mlm's collator then stacks it as it is, its path for the evaluation
set), which keeps the collator's own random draws out of the comparison.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

# The shared run settings: accumulation 3 over an epoch of 13 batches at 1 rank (7 at 2), a clip that
# binds, a warm-up, weight decay, evaluation after each epoch with a short last eval batch.
N_TRAIN, N_EVAL = 26, 7
SETTINGS = dict(
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    gradient_accumulation_steps=3,
    num_train_epochs=2,
    learning_rate=2e-3,
    weight_decay=0.1,  # over 10 steps moves a decayed weight by 2e-3 of itself: a wrong no-decay group shows
    adam_epsilon=1e-8,
    warmup_steps=2,
    lr_scheduler_type="linear",
    max_grad_norm=0.5,
    seed=7,
    logging_steps=1,
    eval_strategy="epoch",
)
CASES = ("gpt2", "bert", "t5")


class Recording(torch.utils.data.Dataset):
    """A dataset that notes which indices were read, in order (the data order a trainer used)."""

    def __init__(self, items):
        self.items, self.seen = list(items), []

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.seen.append(int(i))
        return self.items[i]


def _assets(name: str) -> str:
    from gaudi_launch.runtime.data import ASSETS

    return os.path.join(ASSETS, name)


def save_initial_weights(init_dir: str) -> None:
    """Build each model once from its shipped config with a seed and save it: both trainers load these."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    from gaudi_launch.runtime import data, mlm

    tokenizer = data.load_tokenizer()
    mlm.add_mask_token(tokenizer)
    for case, folder, cls in (
        ("gpt2", "tiny-gpt2", AutoModelForCausalLM),
        ("bert", "tiny-bert", AutoModelForMaskedLM),
        ("t5", "tiny-t5", AutoModelForSeq2SeqLM),
    ):
        config = AutoConfig.from_pretrained(_assets(folder))
        config.vocab_size = len(tokenizer)
        torch.manual_seed(1234)
        cls.from_config(config).save_pretrained(os.path.join(init_dir, case))


def case_data(case: str):
    """(train items, eval items, collator) as the shipped example script builds them, cut small."""
    from gaudi_launch.runtime import data, mlm, summarization

    texts = data.load_text_files(None, None)
    tokenizer = data.load_tokenizer()
    if case == "gpt2":  # scripts/run_clm.py
        train = data.BlockDataset(data.tokenize_and_group(texts["train"], tokenizer, 32)[:N_TRAIN])
        evals = data.BlockDataset(data.tokenize_and_group(texts["validation"], tokenizer, 32)[:N_EVAL])
        return [train[i] for i in range(len(train))], [evals[i] for i in range(len(evals))], data.causal_lm_collator
    if case == "bert":  # scripts/run_mlm.py
        mask_id = mlm.add_mask_token(tokenizer)
        specials = [tokenizer.pad_token_id, tokenizer.eos_token_id]
        train = data.tokenize_and_group(texts["train"], tokenizer, 32)[:N_TRAIN]
        evals = data.tokenize_and_group(texts["validation"], tokenizer, 32)[:N_EVAL]
        train = mlm.premask(train, mask_id, len(tokenizer), 0.15, specials, seed=11)
        evals = mlm.premask(evals, mask_id, len(tokenizer), 0.15, specials)
        return train, evals, mlm.MLMCollator(mask_id, len(tokenizer), 0.15, specials)
    # scripts/run_summarization.py: padded to each batch's longest, labels padded with -100
    pairs = summarization.fable_pairs(texts["train"])
    train = summarization.encode_pairs(pairs[:N_TRAIN], tokenizer, 48, 40)
    evals = summarization.encode_pairs(summarization.fable_pairs(texts["validation"])[:N_EVAL], tokenizer, 48, 40)
    return train, evals, WithDecoderInputs(summarization.Seq2SeqCollator(tokenizer.pad_token_id))


class WithDecoderInputs:
    """T5's decoder inputs made in the collator (labels shifted right, as T5._shift_right and HF's
    DataCollatorForSeq2Seq(model=...) make them), so a loss outside the model (token_sum_loss) has them."""

    def __init__(self, collator, start_id: int = 0, pad_id: int = 0):
        self.collator, self.start_id, self.pad_id = collator, start_id, pad_id

    def __call__(self, features):
        batch = self.collator(features)
        labels = batch["labels"]
        decoder = labels.new_full(labels.shape, self.start_id)
        decoder[:, 1:] = labels[:, :-1]
        batch["decoder_input_ids"] = decoder.masked_fill(decoder == -100, self.pad_id)
        return batch


def token_sum_loss(outputs, labels, num_items_in_batch=None):
    """The loss transformers' Trainer means by num_items_in_batch: the summed token cross-entropy over the
    tokens of the whole accumulation window on all ranks (Trainer._get_num_items_in_batch). Given to HF's
    Trainer for BERT and T5 (compute_loss_func): in 5.24 BertForMaskedLM.forward and
    T5ForConditionalGeneration.forward take **kwargs, so the Trainer counts on them to divide by
    num_items_in_batch (training_step: loss_is_scaled_for_ga, no division by the accumulation steps;
    compute_loss: times the world size), but they return their own per-batch mean (CrossEntropyLoss()),
    which makes the gradient gradient_accumulation_steps x world_size too large (huggingface/transformers#47688,
    open)."""
    logits = outputs["logits"].float()
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return total / num_items_in_batch


DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")  # GPT-2's (0.1 in gpt2's own config)


def load_model(init_dir: str, case: str, dropout: float = 0.0):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    cls = {"gpt2": AutoModelForCausalLM, "bert": AutoModelForMaskedLM, "t5": AutoModelForSeq2SeqLM}[case]
    extra = {key: dropout for key in DROPOUT_KEYS} if dropout else {}
    model = cls.from_pretrained(os.path.join(init_dir, case), **extra)
    if case == "gpt2":
        model.loss_type = "ForCausalLM"  # as scripts/run_clm.py sets it
    return model


def run_ours(init_dir, out, case, masked_only=False, save_steps=0, resume=None, dropout=0.0, **over):
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    train, evals, collator = case_data(case)
    train_set = Recording(train)
    args = TrainingArguments(
        output_dir=out,
        device="cpu",
        mlm_head_masked_only=masked_only,
        save_steps=save_steps,
        overwrite_output_dir=True,
        **{**SETTINGS, **over},
    )
    trainer = Trainer(
        load_model(init_dir, case, dropout),
        args,
        train_dataset=train_set,
        eval_dataset=Recording(evals),
        data_collator=collator,
        log=lambda s: None,
    )
    result = trainer.train(resume_from_checkpoint=resume)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))] if trainer.rank == 0 else []
    return trainer, {
        "loss": [r["loss"] for r in rows if "loss" in r],
        "step": [r["step"] for r in rows if "loss" in r],
        "lr": [r["learning_rate"] for r in rows if "loss" in r],
        "grad_norm": [r.get("grad_norm") for r in rows if "loss" in r],
        "eval_loss": [r["eval_loss"] for r in rows if "eval_loss" in r],
        "eval_step": [r["step"] for r in rows if "eval_loss" in r],
        "global_step": result.global_step,
        "train_loss": result.train_loss,
        "order": train_set.seen,
    }


def run_hf(init_dir, out, case, dropout=0.0, resume=None, **over):
    from transformers import Trainer, TrainingArguments

    train, evals, collator = case_data(case)
    train_set = Recording(train)
    settings = {"save_strategy": "no", **SETTINGS, **over}
    args = TrainingArguments(
        output_dir=out,
        use_cpu=True,
        report_to="none",
        optim="adamw_torch_fused",  # ours: torch's fused AdamW off HPU (gaudi_launch/runtime/optim.py)
        dataloader_pin_memory=False,
        disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        **settings,
    )
    trainer = Trainer(
        model=load_model(init_dir, case, dropout),
        args=args,
        train_dataset=train_set,
        eval_dataset=Recording(evals),
        data_collator=collator,
        compute_loss_func=None if case == "gpt2" else token_sum_loss,  # GPT-2's forward divides itself
    )
    result = trainer.train(resume_from_checkpoint=resume)
    logs = trainer.state.log_history
    return trainer, {
        "loss": [r["loss"] for r in logs if "loss" in r],
        "step": [r["step"] for r in logs if "loss" in r],
        "lr": [r["learning_rate"] for r in logs if "loss" in r],
        "grad_norm": [r.get("grad_norm") for r in logs if "loss" in r],
        "eval_loss": [r["eval_loss"] for r in logs if "eval_loss" in r],
        "eval_step": [r["step"] for r in logs if "eval_loss" in r],
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "order": train_set.seen,
    }


def _pieces(name: str, tensor: torch.Tensor):
    """(label, slice) of a parameter to compare on its own scale. GPT-2's c_attn.bias is query, key and value
    biases in one tensor: the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared
    by all keys), so what it holds after training is AdamW's normalised rounding noise (about 2e-6, against
    9e-3 for the query and value biases), which no two runs share. BERT's key bias is a tensor of its own.
    Those are compared in absolute terms."""
    if name.endswith("attn.c_attn.bias"):
        q, k, v = tensor.chunk(3)
        return [(name + "[query]", q), (name + "[value]", v), (name + "[key]", k)]
    if name.endswith("attention.self.key.bias"):
        return [(name + "[key]", tensor)]
    return [(name, tensor)]


def weight_difference(a: torch.nn.Module, b: torch.nn.Module) -> dict:
    """Each parameter against its own scale: the largest max |a - b| / max |b| over the parameters (a small
    tensor's error is not hidden under the largest weight's scale) and which; GPT-2's key biases apart, in
    absolute terms (see _pieces)."""
    worst, where, key_bias = 0.0, "", 0.0
    pb = dict(b.named_parameters())
    for name, p in a.named_parameters():
        for (label, x), (_, y) in zip(_pieces(name, p.detach().float()), _pieces(name, pb[name].detach().float())):
            diff = (x - y).abs().max().item()
            if label.endswith("[key]"):
                key_bias = max(key_bias, diff)
                continue
            rel = diff / max(y.abs().max().item(), 1e-30)
            if rel >= worst:
                worst, where = rel, label
    return {"relative": worst, "where": where, "key_bias_abs": key_bias}


def main(init_dir: str, out_dir: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict = {}
    # EQUIV_CASES=gpt2 runs one case (a quicker look while working; the tests run them all).
    for case in os.environ.get("EQUIV_CASES", ",".join(CASES)).split(","):
        hf_trainer, hf = run_hf(init_dir, os.path.join(out_dir, f"{case}-hf"), case)
        ours_trainer, ours = run_ours(init_dir, os.path.join(out_dir, f"{case}-ours"), case, save_steps=1)
        ours["weights_vs_hf"] = weight_difference(ours_trainer.model, hf_trainer.model)
        entry = {"hf": hf, "ours": ours}
        # Resume: from the checkpoint one step into the second epoch, to the end (our save_steps=1 run
        # wrote a checkpoint at every step; the same run's numbers must follow from there).
        per_epoch = hf["global_step"] // SETTINGS["num_train_epochs"]
        ckpt_dir = os.path.join(out_dir, f"{case}-ours", f"checkpoint-{per_epoch + 1}")
        _, resumed = run_ours(init_dir, os.path.join(out_dir, f"{case}-ours"), case, resume=ckpt_dir)
        entry["resumed"] = {**resumed, "from_step": per_epoch + 1}
        if case == "gpt2":
            # Checkpoints interchangeable both ways: transformers' Trainer resumes from ours, ours from its; each
            # goes on with the unbroken run's numbers.
            _, hf_from_ours = run_hf(init_dir, os.path.join(out_dir, "hf-from-ours"), case, resume=ckpt_dir)
            entry["hf_resumes_ours"] = {**hf_from_ours, "from_step": per_epoch + 1}
            hf_saving = os.path.join(out_dir, "hf-saving")
            run_hf(init_dir, hf_saving, case, save_strategy="steps", save_steps=per_epoch + 1)
            hf_ckpt = os.path.join(hf_saving, f"checkpoint-{per_epoch + 1}")
            _, ours_from_hf = run_ours(init_dir, os.path.join(out_dir, "ours-from-hf"), case, resume=hf_ckpt)
            entry["ours_resumes_hf"] = {**ours_from_hf, "from_step": per_epoch + 1}
            entry["checkpoint_files"] = sorted(os.listdir(ckpt_dir))
        if case == "bert":  # the one deliberate difference: the head on masked positions only
            _, masked = run_ours(init_dir, os.path.join(out_dir, "bert-masked"), case, masked_only=True)
            entry["masked_only"] = masked
        if case == "gpt2":
            # fast_ddp: gradients averaged in one fused buffer instead of DDP's buckets, clipped there at once.
            fast_trainer, fast = run_ours(
                init_dir, os.path.join(out_dir, "fast-ours"), case, distribution_strategy="fast_ddp"
            )
            fast["weights_vs_hf"] = weight_difference(fast_trainer.model, hf_trainer.model)
            entry["fast_ddp"] = fast
            # Stopped by max_steps inside an epoch, logging every 3 steps (the mean since the last log), and
            # HF's evaluations: every 3 steps and at the stop, or (by epoch) at each epoch's end and the stop.
            for name, over in (
                ("stop_steps", dict(max_steps=7, logging_steps=3, eval_strategy="steps", eval_steps=3)),
                ("stop_epoch", dict(max_steps=7, logging_steps=3)),
            ):
                _, hf_stop = run_hf(init_dir, os.path.join(out_dir, f"{name}-hf"), case, **over)
                _, ours_stop = run_ours(init_dir, os.path.join(out_dir, f"{name}-ours"), case, **over)
                entry[name] = {"hf": hf_stop, "ours": ours_stop}
            # No clip (so a wrong gradient scale shows in the weights, not only in grad_norm), dropout 0.1
            # (both trainers draw from the global RNG in the same order; resumed mid-epoch too) and bf16.
            for name, over in (
                ("noclip", dict(max_grad_norm=0.0)),
                ("dropout", dict(dropout=0.1)),
                ("bf16", dict(bf16=True)),
            ):
                hf_t, hf_v = run_hf(init_dir, os.path.join(out_dir, f"{name}-hf"), case, **over)
                save = 1 if name == "dropout" else 0
                ours_t, ours_v = run_ours(
                    init_dir, os.path.join(out_dir, f"{name}-ours"), case, save_steps=save, **over
                )
                ours_v["weights_vs_hf"] = weight_difference(ours_t.model, hf_t.model)
                entry[name] = {"hf": hf_v, "ours": ours_v}
                if name == "dropout":
                    ckpt_dir = os.path.join(out_dir, f"{name}-ours", f"checkpoint-{per_epoch + 1}")
                    _, again = run_ours(init_dir, os.path.join(out_dir, f"{name}-ours"), case, resume=ckpt_dir, **over)
                    entry[name]["resumed"] = {**again, "from_step": per_epoch + 1}
        results[case] = entry
        del hf_trainer, ours_trainer
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
