"""Flags an optimum-habana user brings: every GaudiTrainingArguments field, and the run_clm README commands.

The field list is read from optimum-habana 1.21.2's own wheel (scripts/setup-env.sh downloads it
into .venv/peers; it is parsed, never imported), so a flag cannot be forgotten.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shlex
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from gaudi_launch.runtime.args import NOT_IMPLEMENTED, TrainingArguments, not_implemented_notes, parse_args

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / ".venv" / "peers" / "optimum_habana-1.21.2-py3-none-any.whl"


@pytest.fixture(scope="module")
def gaudi_fields() -> dict:
    """{name: default source text} of GaudiTrainingArguments' own fields."""
    if not WHEEL.is_file():
        reason = f"{WHEEL} is missing: run scripts/setup-env.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    source = zipfile.ZipFile(WHEEL).read("optimum/habana/transformers/training_args.py").decode()
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "GaudiTrainingArguments"]
    fields = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
            default = [k.value for k in node.value.keywords if k.arg == "default"]
            fields[node.target.id] = ast.literal_eval(default[0]) if default else None
    return fields


def test_every_gaudi_training_argument_is_accepted(gaudi_fields):
    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    assert len(gaudi_fields) > 40
    missing = sorted(set(gaudi_fields) - set(ours))
    assert not missing, f"optimum-habana flags TrainingArguments does not accept: {missing}"


def test_their_defaults_are_optimum_habanas(gaudi_fields):
    ours = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    # Deliberate: use_lazy_mode None (the user's PT_HPU_LAZY_MODE, else the software's default,
    # instead of forcing lazy mode); attn_implementation None (the model's own); half_precision_backend
    # "hpu_amp" as upstream (which spells it as its choices' first entry).
    deliberate = {"use_lazy_mode", "attn_implementation", "half_precision_backend"}
    differ = {
        name: (ours[name], theirs)
        for name, theirs in gaudi_fields.items()
        if name not in deliberate and ours[name] != theirs and not (theirs is None and ours[name] is None)
    }
    assert not differ, differ


def _a_value(field: dataclasses.Field) -> str:
    choices = field.metadata.get("choices")
    if choices:
        return str(choices[-1])
    kind = str(field.type)
    return "true" if "bool" in kind else "3" if "int" in kind else "0.5" if "float" in kind else "adamw_torch"


def test_each_parses_from_the_command_line(gaudi_fields):
    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    for name in gaudi_fields:
        value = _a_value(ours[name])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the flash_attention_* flags need the fused kernel asked for
            base = [] if name == "attn_implementation" else ["--attn_implementation", "gaudi_fused_sdpa"]
            (args,) = parse_args((TrainingArguments,), base + [f"--{name}", value])
        assert str(getattr(args, name)).lower() == value.lower() or name == "use_hpu_graphs", (name, value)


def test_flags_without_an_effect_here_say_so_once(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(UserWarning, match="--fp8 is accepted for optimum-habana compatibility but has no effect"):
        TrainingArguments(fp8=True)
    assert not_implemented_notes(TrainingArguments()) == {}
    monkeypatch.setenv("RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainingArguments(fp8=True)  # only rank 0 says it
    names = [f.name for f in dataclasses.fields(TrainingArguments) if f.metadata.get("help") == NOT_IMPLEMENTED]
    assert "use_hpu_graphs_for_inference" not in names and "fp8" in names


def test_use_hpu_graphs_is_the_older_name_for_inference_graphs():
    assert TrainingArguments(use_hpu_graphs=True).use_hpu_graphs_for_inference is True


# optimum-habana examples/language-modeling/README.md: the run_clm commands' script arguments
# (single card, multi-card gaudi_spawn, DeepSpeed, from scratch, streaming).
README_COMMANDS = [
    "--model_name_or_path gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_train_batch_size 4 --per_device_eval_batch_size 4 --do_train --do_eval --output_dir {out} "
    "--gaudi_config_name Habana/gpt2 --use_habana --use_lazy_mode --use_hpu_graphs_for_inference "
    "--throughput_warmup_steps 3",
    "--model_name_or_path gpt2 --train_file {train} --validation_file {valid} --per_device_train_batch_size 8 "
    "--per_device_eval_batch_size 8 --do_train --do_eval --output_dir {out} --gaudi_config_name Habana/gpt2 "
    "--use_habana --use_lazy_mode --use_hpu_graphs_for_inference --throughput_warmup_steps 3",
    "--model_name_or_path gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_train_batch_size 4 --per_device_eval_batch_size 4 --do_train --do_eval --output_dir {out} "
    "--gaudi_config_name Habana/gpt2 --use_habana --use_lazy_mode --use_hpu_graphs_for_inference "
    "--gradient_checkpointing --use_cache False --throughput_warmup_steps 3",
    "--model_name_or_path EleutherAI/gpt-j-6b --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_train_batch_size 16 --per_device_eval_batch_size 4 --do_train --do_eval --output_dir {out} "
    "--gaudi_config_name Habana/gpt2 --use_habana --use_lazy_mode --gradient_checkpointing "
    "--use_hpu_graphs_for_inference --throughput_warmup_steps 3 --deepspeed {ds}",
    "--config_name gpt2 --tokenizer_name gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_train_batch_size 4 --per_device_eval_batch_size 4 --do_train --do_eval --output_dir {out} "
    "--gaudi_config_name Habana/gpt2 --use_habana --use_lazy_mode --use_hpu_graphs_for_inference "
    "--throughput_warmup_steps 3",
    "--model_name_or_path gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_eval_batch_size 4 --do_eval --output_dir {out} --gaudi_config_name Habana/gpt2 --use_habana "
    "--use_lazy_mode --use_hpu_graphs_for_inference --bf16",
    "--model_name_or_path gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 "
    "--per_device_train_batch_size 4 --per_device_eval_batch_size 4 --do_train --output_dir {out} "
    "--gaudi_config_name Habana/gpt2 --use_habana --use_lazy_mode --use_hpu_graphs_for_inference "
    "--throughput_warmup_steps 3 --streaming --max_steps 1000 --do_eval",
    "--model_type gpt2 --tokenizer_name gpt2 --config_overrides=n_embd=1024,n_head=16,n_layer=48,n_positions=1024 "
    "--dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --per_device_train_batch_size 2 "
    "--per_device_eval_batch_size 2 --do_train --do_eval --gradient_checkpointing --use_cache False "
    "--output_dir {out} --use_habana --use_lazy_mode --use_hpu_graphs_for_inference --gaudi_config_name Habana/gpt2 "
    "--throughput_warmup_steps 3",
]


@pytest.mark.parametrize("command", README_COMMANDS)
def test_run_clm_accepts_the_optimum_habana_readme_commands(command, tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import run_clm
    finally:
        sys.path.pop(0)
    argv = shlex.split(
        command.format(
            out=tmp_path / "out", train=tmp_path / "t.txt", valid=tmp_path / "v.txt", ds=tmp_path / "ds.json"
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        margs, dargs, targs = parse_args((run_clm.ModelArguments, run_clm.DataArguments, TrainingArguments), argv)
    assert targs.use_habana and targs.use_lazy_mode and targs.gaudi_config_name == "Habana/gpt2"
    assert targs.use_hpu_graphs_for_inference


def test_config_overrides_and_model_type_shape_a_model_trained_from_scratch():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import run_clm
    finally:
        sys.path.pop(0)
    margs = run_clm.ModelArguments(model_type="gpt2", config_overrides="n_embd=48,n_head=3,n_layer=1")
    model = run_clm.build_model(margs, vocab_size=100)
    assert (model.config.n_embd, model.config.n_head, model.config.n_layer, model.config.vocab_size) == (48, 3, 1, 100)
