"""Summarization (T5 fine-tuning, seq2seq) with gaudi_launch's runtime.

Takes optimum-habana's run_summarization.py flags, e.g.
    gaudi-launch --num_devices 8 scripts/run_summarization.py --model_name_or_path t5-3b \\
        --gaudi_config_name Habana/t5 --do_train --do_eval --source_prefix "summarize: " \\
        --output_dir runs/t5 --per_device_train_batch_size 4 --gradient_checkpointing \\
        --predict_with_generate --use_habana --use_lazy_mode --throughput_warmup_steps 3 --bf16
Offline, the model is a tiny T5 built from gaudi_launch/runtime/assets/tiny-t5 (or a local
config/checkpoint directory), trained from scratch on a summarization set made from the shipped corpus
(each fable's text, and its first sentence as the summary). Reports ROUGE before and after training
(with --predict_with_generate) and the activation memory one training step keeps for backward, which
--gradient_checkpointing (the guide's only memory optimisation for T5-3B) cuts.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional

from gaudi_launch.runtime.args import TrainingArguments, parse_args


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = None  # a local checkpoint directory
    config_name: Optional[str] = None  # a local config directory (trained from scratch)
    tokenizer_name: Optional[str] = None  # a local tokenizer directory; default: the shipped one
    use_cache: bool = False


@dataclass
class DataArguments:
    dataset_name: Optional[str] = None  # accepted; offline, the shipped fables are the data set
    dataset_config_name: Optional[str] = None
    dataset_config: Optional[str] = None  # optimum's README spells it so (HfArgumentParser takes abbreviations)
    train_file: Optional[str] = None  # .csv or JSON lines, a document and its summary a row (default: the fables)
    validation_file: Optional[str] = None
    text_column: Optional[str] = None  # the files' document column (default: the first)
    summary_column: Optional[str] = None  # the files' summary column (default: the second)
    source_prefix: str = "summarize: "
    max_source_length: int = 128
    max_target_length: int = 48
    val_max_target_length: Optional[int] = None
    pad_to_max_length: bool = False  # fixed shapes (what HPU lazy mode and graphs want)
    ignore_pad_token_for_loss: bool = True  # false: padded label positions count in the loss, as their pad id
    num_beams: int = 1
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    max_predict_samples: Optional[int] = None


@dataclass
class Seq2SeqArguments:
    predict_with_generate: bool = False
    generation_max_length: Optional[int] = None
    generation_num_beams: Optional[int] = None


def build_model(margs: ModelArguments, vocab_size: int):
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from gaudi_launch.runtime.data import ASSETS
    from gaudi_launch.runtime.examples import note

    source = margs.model_name_or_path
    if source and os.path.isdir(source):
        return AutoModelForSeq2SeqLM.from_pretrained(source)
    if source:
        note(
            f"run_summarization: '{source}' is not a local directory and the hub is not reachable here: "
            "training the shipped tiny T5 from scratch instead (pass --config_name DIR for another model)",
        )
    config = AutoConfig.from_pretrained(margs.config_name or os.path.join(ASSETS, "tiny-t5"))
    config.vocab_size = vocab_size
    return AutoModelForSeq2SeqLM.from_config(config)


def activation_bytes(model, batch) -> int:
    """Bytes of tensors one training forward keeps for backward (what checkpointing trades for compute)."""
    import torch

    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total[0]


def generate_rouge(trainer, tokenizer, pairs, encoded, collator, dargs, sargs):
    """ROUGE of generated summaries over the evaluation pairs (rank 0 generates; one node, as advised)."""
    import torch

    from gaudi_launch.runtime.rouge import corpus_rouge

    model = trainer.model
    max_new = sargs.generation_max_length or dargs.val_max_target_length or dargs.max_target_length
    beams = sargs.generation_num_beams or dargs.num_beams
    predictions = []
    # evaluate() left the forward in HPU graphs (--use_hpu_graphs_for_inference): a replay runs no
    # Python, so generation's cache would not grow; generate with the model's own forward.
    trainer.inference_graphs.off()
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), 8):
            batch = collator(encoded[start : start + 8])
            mask = batch.get("attention_mask")  # none where nothing is padded
            out = model.generate(
                input_ids=batch["input_ids"].to(trainer.info.device),
                attention_mask=None if mask is None else mask.to(trainer.info.device),
                max_new_tokens=max_new,
                num_beams=beams,
                do_sample=False,
            )
            predictions += tokenizer.batch_decode(out.cpu(), skip_special_tokens=True)
    model.train()
    scores = corpus_rouge(predictions, [p["summary"] for p in pairs])
    return {
        **scores,
        "gen_len": sum(len(p.split()) for p in predictions) / max(1, len(predictions)),
        "example": predictions[0] if predictions else "",
    }


def main(argv=None) -> int:
    margs, dargs, sargs, targs = parse_args((ModelArguments, DataArguments, Seq2SeqArguments, TrainingArguments), argv)
    from gaudi_launch.runtime import data, summarization
    from gaudi_launch.runtime.device import DeviceUnavailable, select_device
    from gaudi_launch.runtime.examples import refusing_bad_configs, saved_tokenizer, train_and_evaluate
    from gaudi_launch.runtime.trainer import Trainer, set_seed
    from gaudi_launch.runtime.zero_init import prepare_deepspeed

    try:
        select_device(targs)
    except DeviceUnavailable as exc:
        print(f"run_summarization.py: error: {exc}", file=sys.stderr)
        return 2
    texts = data.load_text_files(None, None)

    tokenizer = data.load_tokenizer(margs.tokenizer_name or saved_tokenizer(margs.model_name_or_path))
    columns = (dargs.text_column, dargs.summary_column)
    if dargs.train_file:
        train_pairs = summarization.read_pairs(dargs.train_file, *columns)
    else:
        train_pairs = summarization.fable_pairs(texts["train"])
    if dargs.validation_file:
        eval_pairs = summarization.read_pairs(dargs.validation_file, *columns)
    else:
        eval_pairs = summarization.fable_pairs(texts["validation"])
    if dargs.max_train_samples:
        train_pairs = train_pairs[: dargs.max_train_samples]
    if dargs.max_eval_samples:
        eval_pairs = eval_pairs[: dargs.max_eval_samples]
    target_len = dargs.val_max_target_length or dargs.max_target_length
    train = summarization.encode_pairs(
        train_pairs, tokenizer, dargs.max_source_length, dargs.max_target_length, dargs.source_prefix
    )
    evals = summarization.encode_pairs(eval_pairs, tokenizer, dargs.max_source_length, target_len, dargs.source_prefix)
    fixed = dargs.pad_to_max_length
    collator = summarization.Seq2SeqCollator(
        tokenizer.pad_token_id,
        dargs.max_source_length if fixed else 0,
        dargs.max_target_length if fixed else 0,
        label_pad=summarization.IGNORE if dargs.ignore_pad_token_for_loss else tokenizer.pad_token_id,
    )
    with refusing_bad_configs("run_summarization.py"):  # a config that contradicts the flags: exit 2 before training
        prepare_deepspeed(targs)  # --deepspeed with ZeRO-3: the model is built partitioned (zero.Init)
        set_seed(targs.seed)  # the same initial weights in every run, as HF's examples do
        model = build_model(margs, len(tokenizer))
        model.config.use_cache = margs.use_cache
        trainer = Trainer(
            model,
            targs,
            train_dataset=summarization.ListDataset(train),
            eval_dataset=summarization.ListDataset(evals),
            data_collator=collator,
            tokens_per_sample=dargs.max_source_length,
        )
    results = {
        "activation_memory (MB)": round(
            activation_bytes(
                trainer.model,
                {k: v.to(trainer.info.device) for k, v in collator(train[: targs.per_device_train_batch_size]).items()},
            )
            / 2**20,
            3,
        ),
        "gradient_checkpointing": targs.gradient_checkpointing,
    }
    rouge = sargs.predict_with_generate and trainer.rank == 0
    train_and_evaluate(
        trainer,
        tokenizer,
        targs,
        results,
        extra_eval=(lambda: generate_rouge(trainer, tokenizer, eval_pairs, evals, collator, dargs, sargs))
        if rouge
        else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
