"""Flags an optimum-habana user brings: every GaudiTrainingArguments field, and the run_clm README commands.

The field list is read from optimum-habana 1.21.2's own wheel (scripts/setup-env.sh downloads it
into .venv/peers; it is parsed, never imported), so a flag cannot be forgotten.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Optional

import pytest
import torch

from gaudi_launch.runtime.args import TrainingArguments, parse_args, refusals, warmup_steps
from gaudi_launch.runtime.device import DeviceInfo
from gaudi_launch.runtime.ds_config import resolve_ds_config
from gaudi_launch.runtime.graphs import compile_backend, compile_model
from gaudi_launch.runtime.hpu_env import script_hpu_flags
from gaudi_launch.runtime.optim import make_scheduler
from gaudi_launch.runtime.summarization import Seq2SeqCollator, read_pairs
from gaudi_launch.runtime.trainer import Trainer, evaluation_due

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
        if "refused" in ours[name].metadata:
            continue  # test_refused_flags_say_why
        value = _a_value(ours[name])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the flash_attention_* flags need the fused kernel asked for
            base = [] if name == "attn_implementation" else ["--attn_implementation", "gaudi_fused_sdpa"]
            (args,) = parse_args((TrainingArguments,), base + [f"--{name}", value])
        assert str(getattr(args, name)).lower() == value.lower() or name == "use_hpu_graphs", (name, value)


def test_refused_flags_say_why_and_their_defaults_pass(capsys):
    assert refusals(TrainingArguments()) == {}
    refused = [f for f in dataclasses.fields(TrainingArguments) if "refused" in f.metadata]
    assert {"fp8", "fsdp", "context_parallel_size", "load_best_model_at_end"} <= {f.name for f in refused}
    with pytest.raises(SystemExit) as exc:
        parse_args((TrainingArguments,), ["--fp8", "--context_parallel_size", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--fp8 True is not supported by gaudi-launch's runtime: fp8 needs Habana's Transformer Engine" in err
    assert "--context_parallel_size 4 is not supported by gaudi-launch's runtime: context parallelism" in err
    assert TrainingArguments(label_names=["labels"]).label_names == ["labels"]  # what the runtime does anyway
    with pytest.raises(ValueError, match="--label_names \\['y'\\] is not supported"):
        TrainingArguments(label_names=["y"])
    assert TrainingArguments(optim="paged_adamw_32bit").optim == "paged_adamw_32bit"  # AdamW, paged
    with pytest.raises(ValueError, match="--optim adafactor is not supported by gaudi-launch's runtime: it trains"):
        TrainingArguments(optim="adafactor")


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


# ---- every example command line of optimum-habana 1.21.2's READMEs (tests/data, extracted from its repo) ----

EXAMPLES = ROOT / "tests" / "data" / "optimum_habana_1.21.2_example_commands.tsv"
SHIPPED = ("run_clm.py", "run_mlm.py", "run_summarization.py")
# TrainingArguments fields of transformers 4.55 (optimum-habana 1.21.2's) that 5.x dropped and the commands use.
TRANSFORMERS_455_ONLY = {"warmup_ratio", "overwrite_output_dir", "adafactor", "push_to_hub_model_id"}
# The commands' training flags this runtime refuses (each with its reason); any other is honoured.
EXPECTED_REFUSED = {
    "bf16_full_eval",
    "compile_from_sec_iteration",
    "context_parallel_size",
    "do_predict",
    "fp8",
    "fsdp",
    "fsdp_config",
    "hub_model_id",
    "load_best_model_at_end",
    "logging_strategy",  # epoch
    "metric_for_best_model",
    "push_to_hub",
    "push_to_hub_model_id",
    "run_name",
    "use_regional_compilation",
    "use_zero3_leaf_promotion",
}  # `--adafactor False` is used too: its default, so it passes


def example_commands() -> list[tuple[str, str, list[str]]]:
    rows = []
    for line in EXAMPLES.read_text().splitlines():
        if not line.startswith("#"):
            readme, script, words = line.split("\t")
            rows.append((readme, script, [w for w in shlex.split(words) if w != "..."]))
    return rows


def flags(words: list[str]) -> list[tuple[str, list[str]]]:
    """[(name, the flag's words)] in order: `--a-b=1` and `--a_b 1 2` alike. Pure."""
    out: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            out.append((word[2:].split("=", 1)[0].replace("-", "_"), [word]))
        elif out:
            out[-1][1].append(word)
    return out


def _given(words: list[str]) -> list[str]:
    return words[0].split("=", 1)[1:] + words[1:]


def _same(parsed, given: list[str]) -> bool:
    if not given:
        return parsed is True
    if isinstance(parsed, list):
        return [str(p) for p in parsed] == given
    if isinstance(parsed, bool):
        return str(parsed).lower() == given[0].lower()
    if isinstance(parsed, (int, float)):
        return float(parsed) == float(given[0])
    return str(parsed) == given[0]


def _script_classes(script: str) -> tuple:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        module = __import__(script[:-3])
    finally:
        sys.path.pop(0)
    own = [v for v in vars(module).values() if dataclasses.is_dataclass(v) and v.__module__ == module.__name__]
    return tuple(own)  # in the order the script declares (and parses) them


def _parse(classes: tuple, argv: list[str], capsys) -> tuple[Optional[dict], str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parsed = parse_args(classes, argv)
        except SystemExit:
            return None, capsys.readouterr().err
    return {f.name: getattr(obj, f.name) for obj in parsed for f in dataclasses.fields(obj)}, ""


def test_every_example_command_is_honoured_or_refused_with_a_reason(gaudi_fields, capsys):
    import transformers

    training = set(gaudi_fields) | TRANSFORMERS_455_ONLY
    training |= {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    source = zipfile.ZipFile(WHEEL).read("optimum/habana/transformers/training_args_seq2seq.py").decode()
    training |= set(re.findall(r"^    (\w+): .*= field\(", source, re.M))  # GaudiSeq2SeqTrainingArguments
    rows = example_commands()
    assert len(rows) >= 70 and {script for _, script, _ in rows} >= set(SHIPPED)
    seq2seq = _script_classes("run_summarization.py")[-1]  # its Seq2SeqArguments: predict_with_generate, ...
    assert seq2seq.__name__ == "Seq2SeqArguments"
    refused: dict[str, str] = {}
    honoured: set[str] = set()
    for readme, script, words in rows:
        # Our own scripts take the whole command line; another script's own flags are that script's business,
        # its training flags (transformers' and optimum-habana's TrainingArguments) are the runtime's.
        if script in SHIPPED:
            classes = _script_classes(script) + (TrainingArguments,)
            chosen = flags(words)
        else:
            classes = (seq2seq, TrainingArguments)
            chosen = [(name, w) for name, w in flags(words) if name in training]
        argv = [w for _, group in chosen for w in group]
        values, err = _parse(classes, argv, capsys)
        if values is None:
            named = re.findall(r"--(\w+) .*? is not supported by gaudi-launch's runtime: \S", err)
            assert named, f"{readme} {script}: refused without a reason: {err}"
            refused.update(dict.fromkeys(named, f"{readme} {script}"))
            chosen = [(name, w) for name, w in chosen if name not in named]
            values, err = _parse(classes, [w for _, group in chosen for w in group], capsys)
            assert values is not None, f"{readme} {script}: {err}"
        for name, group in chosen:
            assert _same(values[name], _given(group)), (readme, script, name, values[name], group)
            honoured.add(name)
    assert set(refused) == EXPECTED_REFUSED, refused
    new = {"save_strategy", "warmup_ratio", "torch_compile_backend", "eval_delay", "allow_unspec_int_on_nn_module"}
    assert new | {"remove_unused_columns", "overwrite_output_dir", "label_names", "optim"} <= honoured


# ---- what the honoured flags do ----


class _Reg(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y)}


def _regression(n: int = 20) -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -1.0, 0.5, 2.0])
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _train(out: Path, resume=None, **kw) -> tuple[list, list, list]:
    """(checkpoint steps, [(step, loss)], evaluated steps) of 3 epochs of 5 steps."""
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=3, learning_rate=0.05, logging_steps=1,
        device="cpu", seed=1, **kw,
    )  # fmt: skip
    data = _regression()
    Trainer(_Reg(), args, train_dataset=data, eval_dataset=data[:8], log=lambda s: None).train(resume)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    return saved, [(r["step"], r["loss"]) for r in rows if "loss" in r], [r["step"] for r in rows if "eval_loss" in r]


def test_save_strategy_and_eval_delay_as_transformers_decides_them(tmp_path):
    saved, curve, evaluated = _train(
        tmp_path / "epoch", save_strategy="epoch", save_steps=2, eval_strategy="epoch", eval_delay=2
    )
    assert saved == [5, 10, 15]  # each epoch's end, --save_steps aside
    assert evaluated == [10, 15]  # not before the second epoch
    # transformers also saves after the last step (DefaultFlowCallback.on_step_end), and with "epoch" at a
    # stop inside an epoch (Trainer._run_epoch ends the epoch there).
    assert _train(tmp_path / "steps", save_strategy="steps", save_steps=4)[0] == [4, 8, 12, 15]
    assert _train(tmp_path / "stop", save_strategy="epoch", max_steps=7)[0] == [5, 7]
    assert _train(tmp_path / "no", save_strategy="no", save_steps=2)[0] == []
    # An epoch-end checkpoint resumes at the next epoch's start: the same curve as the run that went on.
    shutil.copytree(tmp_path / "epoch" / "checkpoint-5", tmp_path / "resumed" / "checkpoint-5")
    _, resumed, _ = _train(tmp_path / "resumed", resume="latest", save_strategy="epoch")
    assert resumed == curve[5:]
    assert evaluation_due(TrainingArguments(eval_strategy="steps", eval_steps=2, eval_delay=3), 4, False)
    assert not evaluation_due(TrainingArguments(eval_strategy="steps", eval_steps=2, eval_delay=3), 2, False)


def test_warmup_ratio_gives_transformers_warmup_steps_and_schedule():
    import transformers

    params = [torch.nn.Parameter(torch.zeros(1))]
    opt_ours, opt_theirs = torch.optim.SGD(params, lr=1.0), torch.optim.SGD(params, lr=1.0)
    ours = make_scheduler(opt_ours, TrainingArguments(warmup_ratio=0.1), 25)
    # transformers 5.x spells the ratio as a warmup_steps below 1, ceil(0.1 x 25) = 3 steps either way.
    assert transformers.TrainingArguments("o", warmup_steps=0.1).get_warmup_steps(25) == 3
    theirs = transformers.get_linear_schedule_with_warmup(opt_theirs, 3, 25)
    for _ in range(25):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), abs=1e-12)
        for opt, sched in ((opt_ours, ours), (opt_theirs, theirs)):
            opt.step()
            sched.step()
    assert warmup_steps(TrainingArguments(warmup_ratio=0.1, warmup_steps=7), 25) == 7  # steps win, as in 4.55
    ds = resolve_ds_config(
        {"scheduler": {"params": {"warmup_num_steps": "auto"}}}, TrainingArguments(warmup_ratio=0.1), 1, 25
    )
    assert ds["scheduler"]["params"]["warmup_num_steps"] == 3


_COMPILED: list = []


def _recording_backend(gm, example_inputs):
    _COMPILED.append(len(example_inputs))
    return gm.forward


def test_torch_compile_backend_reaches_torch_compile_and_implies_compile():
    seen = _COMPILED
    seen.clear()
    if "gaudi_launch_test_backend" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_recording_backend, name="gaudi_launch_test_backend")
    torch._dynamo.reset()
    # torch's own patch restores the switch afterwards (pytest's monkeypatch left dynamo's config broken for
    # later compiles in this process: "allow_unspec_int_on_nn_module does not exist").
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=False):
        args = TrainingArguments(torch_compile_backend="gaudi_launch_test_backend", allow_unspec_int_on_nn_module=True)
        assert args.torch_compile
        cpu = DeviceInfo("cpu", torch.device("cpu"), "gloo", False, -1)
        model = compile_model(torch.nn.Linear(3, 2), cpu, args)
        model(torch.ones(2, 3))
        assert seen and torch._dynamo.config.allow_unspec_int_on_nn_module is True
    assert compile_backend(TrainingArguments(torch_compile=True), "hpu") == "hpu_backend"
    assert compile_backend(TrainingArguments(torch_compile=True), "cpu") == "inductor"
    # The worker decides lazy mode from the script's flags before torch loads: a backend means eager.
    assert script_hpu_flags(["--torch_compile_backend", "hpu_backend"]).torch_compile is True
    torch._dynamo.reset()


def test_summarization_files_and_pad_tokens_in_the_loss(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"article": "A long text.", "highlights": "Short."}\n')
    (tmp_path / "t.csv").write_text("id,text,summary\n1,A long text.,Short.\n")
    assert read_pairs(str(tmp_path / "t.jsonl")) == [{"document": "A long text.", "summary": "Short."}]
    assert read_pairs(str(tmp_path / "t.csv"), "text", "summary") == [{"document": "A long text.", "summary": "Short."}]
    with pytest.raises(ValueError, match="no column 'body'"):
        read_pairs(str(tmp_path / "t.csv"), "body")
    features = [{"input_ids": [5, 6], "labels": [7]}, {"input_ids": [5], "labels": [7, 8]}]
    assert Seq2SeqCollator(0)(features)["labels"].tolist() == [[7, -100], [7, 8]]
    assert Seq2SeqCollator(0, label_pad=0)(features)["labels"].tolist() == [[7, 0], [7, 8]]
