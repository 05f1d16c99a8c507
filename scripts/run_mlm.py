"""Masked language modelling (BERT pre-training, phase-1 style) with gaudi_launch's runtime.

Takes optimum-habana's run_mlm.py flags, e.g.
    gaudi-launch --num_devices 8 scripts/run_mlm.py --model_name_or_path bert-large-uncased \\
        --gaudi_config_name Habana/bert-large-uncased-whole-word-masking --do_train --do_eval \\
        --per_device_train_batch_size 32 --output_dir runs/mlm --use_habana --use_lazy_mode \\
        --use_hpu_graphs_for_inference --throughput_warmup_steps 3 --bf16
Offline, the model is a tiny BERT built from gaudi_launch/runtime/assets/tiny-bert (or a local
config/checkpoint directory), trained from scratch on the shipped corpus and tokenizer (a mask
token is added to it). Reports masked-token accuracy and perplexity before and after training.
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
    model_type: Optional[str] = None  # from scratch: bert (the shipped tiny config)
    config_overrides: Optional[str] = None  # "hidden_size=128,num_hidden_layers=4"


@dataclass
class DataArguments:
    dataset_name: Optional[str] = None
    dataset_config_name: Optional[str] = None
    train_file: Optional[str] = None
    validation_file: Optional[str] = None
    validation_split_percentage: int = 10
    max_seq_length: int = 64
    mlm_probability: float = 0.15
    line_by_line: bool = False  # accepted: the blocks are grouped text either way
    pad_to_max_length: bool = False  # accepted: blocks always have max_seq_length tokens
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None


def build_model(margs: ModelArguments, vocab_size: int):
    from transformers import AutoConfig, AutoModelForMaskedLM

    from gaudi_launch.runtime.data import ASSETS
    from gaudi_launch.runtime.examples import note

    source = margs.model_name_or_path
    if source and os.path.isdir(source):
        return AutoModelForMaskedLM.from_pretrained(source)
    if source:
        note(
            f"run_mlm: '{source}' is not a local directory and the hub is not reachable here: training the "
            "shipped tiny BERT from scratch instead (pass --config_name DIR for another model)",
        )
    config = AutoConfig.from_pretrained(margs.config_name or os.path.join(ASSETS, "tiny-bert"))
    if margs.model_type and margs.model_type != config.model_type:
        raise SystemExit(
            f"run_mlm.py: error: --model_type {margs.model_type}: only {config.model_type} can be "
            "built offline here; pass --config_name DIR"
        )
    if margs.config_overrides:
        config.update_from_string(margs.config_overrides)
    config.vocab_size = vocab_size
    return AutoModelForMaskedLM.from_config(config)


def main(argv=None) -> int:
    margs, dargs, targs = parse_args((ModelArguments, DataArguments, TrainingArguments), argv)
    from gaudi_launch.runtime import data, mlm
    from gaudi_launch.runtime.device import DeviceUnavailable, select_device
    from gaudi_launch.runtime.examples import refusing_bad_configs, saved_tokenizer, train_and_evaluate
    from gaudi_launch.runtime.trainer import Trainer, set_seed
    from gaudi_launch.runtime.zero_init import prepare_deepspeed

    try:
        select_device(targs)
    except DeviceUnavailable as exc:
        print(f"run_mlm.py: error: {exc}", file=sys.stderr)
        return 2
    if dargs.dataset_name:
        texts = data.load_dataset_by_name(dargs.dataset_name, dargs.dataset_config_name)
    else:
        texts = data.load_text_files(dargs.train_file, dargs.validation_file, dargs.validation_split_percentage)
    # a model this script saved
    tokenizer = data.load_tokenizer(margs.tokenizer_name or saved_tokenizer(margs.model_name_or_path))
    mask_id = mlm.add_mask_token(tokenizer)
    specials = [tokenizer.pad_token_id, tokenizer.eos_token_id]
    train_blocks = data.tokenize_and_group(texts["train"], tokenizer, dargs.max_seq_length)
    eval_blocks = data.tokenize_and_group(texts["validation"], tokenizer, dargs.max_seq_length)
    if dargs.max_train_samples:
        train_blocks = train_blocks[: dargs.max_train_samples]
    if dargs.max_eval_samples:
        eval_blocks = eval_blocks[: dargs.max_eval_samples]
    eval_blocks = mlm.premask(eval_blocks, mask_id, len(tokenizer), dargs.mlm_probability, specials)
    with refusing_bad_configs("run_mlm.py"):  # a config that contradicts the flags: exit 2 before training
        prepare_deepspeed(targs)  # --deepspeed with ZeRO-3: the model is built partitioned (zero.Init)
        set_seed(targs.seed)  # the same initial weights in every run, as HF's examples do
        model = build_model(margs, len(tokenizer))
        trainer = Trainer(
            model,
            targs,
            train_dataset=data.BlockDataset(train_blocks),
            eval_dataset=data.BlockDataset(eval_blocks),
            data_collator=mlm.MLMCollator(mask_id, len(tokenizer), dargs.mlm_probability, specials),
            tokens_per_sample=dargs.max_seq_length,
            eval_metrics=mlm.masked_accuracy,
        )
    train_and_evaluate(trainer, tokenizer, targs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
