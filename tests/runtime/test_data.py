"""The offline data side of the causal-LM example: shipped corpus, tokenizer, tiny GPT-2 configs."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from gaudi_launch.errors import UserError
from gaudi_launch.runtime import data
from gaudi_launch.runtime.data import (
    ASSETS,
    BlockDataset,
    DataError,
    causal_lm_collator,
    load_dataset_by_name,
    load_text_files,
    load_tokenizer,
    tokenize_and_group,
)

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(ASSETS) / "corpus"


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def no_network(monkeypatch):
    """Offline as on the cluster: HF_HUB_OFFLINE=1 and any socket connection fails."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise OSError("network access in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --------------------------------------------------------------------------- assets


def test_assets_are_shipped():
    for rel in (
        "corpus/train.txt",
        "corpus/validation.txt",
        "corpus/README.md",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokenizer/special_tokens_map.json",
        "tiny-gpt2/config.json",
        "small-gpt2/config.json",
    ):
        assert (Path(ASSETS) / rel).is_file(), rel
    train, validation = (CORPUS / "train.txt").stat().st_size, (CORPUS / "validation.txt").stat().st_size
    assert 60_000 <= train + validation <= 150_000
    assert 0.05 <= validation / (train + validation) <= 0.15
    assert "public domain" in (CORPUS / "README.md").read_text().lower()


def test_shipped_tokenizer_and_configs_match_the_build_script(no_network):
    # The script retrains from corpus/train.txt; --check fails if any shipped file would change.
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_tokenizer.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_the_corpus(tokenizer):
    lines = _lines(CORPUS / "train.txt") + _lines(CORPUS / "validation.txt")
    encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
    for line, ids in zip(lines, encoded):
        assert tokenizer.decode(ids) == line
    # byte-level: text the corpus never saw, odd whitespace included, still round-trips
    odd = "  naïve café — 東京, 1+1=2\ttabs\n\nand\r\nnewlines  "
    assert tokenizer.decode(tokenizer(odd)["input_ids"]) == odd
    # and it compresses English: well under one token per character
    assert sum(map(len, encoded)) < 0.5 * sum(map(len, lines))


def test_tokenizer_special_tokens_and_vocab_match_the_configs(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(data.EOS_TOKEN)
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == data.EOS_TOKEN
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == tokenizer.pad_token_id == eos == 0
    assert tokenizer("Hello world", add_special_tokens=True)["input_ids"][-1] != eos  # GPT-2 style: none added
    for name in ("tiny-gpt2", "small-gpt2"):
        config = json.loads((Path(ASSETS) / name / "config.json").read_text())
        assert config["vocab_size"] == len(tokenizer) == 1024
        assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == eos


def test_load_tokenizer_from_a_directory_or_a_tokenizer_json(tokenizer):
    text = "The Fox and the Grapes."
    expected = tokenizer(text)["input_ids"]
    for source in ("builtin", data.TOKENIZER_DIR, os.path.join(data.TOKENIZER_DIR, "tokenizer.json")):
        other = load_tokenizer(source)
        assert other(text)["input_ids"] == expected
        assert other.eos_token_id == other.pad_token_id == 0


def test_load_tokenizer_hub_name_gives_a_clear_error(no_network):
    with pytest.raises(DataError) as info:
        load_tokenizer("gaudi-launch-tests/no-such-tokenizer")
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, UserError)
    assert "hub is not reachable here; pass a local directory" in str(err)
    assert "gaudi-launch-tests/no-such-tokenizer" in str(err)


def test_load_tokenizer_missing_path_says_so(tmp_path):
    with pytest.raises(DataError, match="no such tokenizer file or directory"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="cannot load a tokenizer from directory"):
        load_tokenizer(str(tmp_path / "empty"))


# --------------------------------------------------------------------------- text files


def test_load_text_files_default_is_the_shipped_split():
    splits = load_text_files(None, None)
    assert splits["train"] == _lines(CORPUS / "train.txt")
    assert splits["validation"] == _lines(CORPUS / "validation.txt")
    assert len(splits["train"]) == 324 and len(splits["validation"]) == 35
    assert not set(splits["train"]) & set(splits["validation"])


def test_load_text_files_splits_a_train_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"paragraph {i}\n\n" for i in range(40)), encoding="utf-8")
    splits = load_text_files(str(path), None)  # 10% by default
    assert splits["validation"] == [f"paragraph {i}" for i in range(4)]
    assert splits["train"] == [f"paragraph {i}" for i in range(4, 40)]
    assert len(load_text_files(str(path), None, validation_split_percentage=25)["validation"]) == 10
    assert load_text_files(str(path), None, validation_split_percentage=0)["validation"] == []

    val = tmp_path / "val.txt"
    val.write_text("held out\n", encoding="utf-8")
    splits = load_text_files(str(path), str(val))
    assert len(splits["train"]) == 40 and splits["validation"] == ["held out"]


def test_load_text_files_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_text_files(str(tmp_path / "missing.txt"), None)
    bad = tmp_path / "data.json"
    bad.write_text("{}")
    with pytest.raises(DataError, match=r"only plain-text \.txt"):
        load_text_files(str(bad), None)
    with pytest.raises(DataError, match="0 to 99"):
        load_text_files(None, None, validation_split_percentage=100)


# --------------------------------------------------------------------------- blocks


def test_tokenize_and_group_blocks(tokenizer):
    texts = _lines(CORPUS / "validation.txt")
    blocks = tokenize_and_group(texts, tokenizer, block_size=64)
    n_tokens = sum(len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert len(blocks) == n_tokens // 64 > 10  # the remainder is dropped
    assert all(len(b["input_ids"]) == 64 and b["labels"] == b["input_ids"] for b in blocks)
    assert blocks[0]["labels"] is not blocks[0]["input_ids"]
    # documents are joined with eos in between, in order
    stream = [t for b in blocks for t in b["input_ids"]]
    first = tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert stream[: len(first) + 1] == first + [tokenizer.eos_token_id]
    assert tokenizer.decode(stream).startswith(texts[0] + data.EOS_TOKEN + texts[1])
    # a raw tokenizers.Tokenizer gives the same blocks
    assert tokenize_and_group(texts, tokenizer.backend_tokenizer, 64) == blocks
    assert tokenize_and_group(["too short"], tokenizer, 64) == []
    with pytest.raises(DataError):
        tokenize_and_group(texts, tokenizer, 0)


def test_block_dataset_and_collator(tokenizer):
    ds = BlockDataset.from_texts(_lines(CORPUS / "validation.txt"), tokenizer, block_size=32)
    assert len(ds) > 0 and ds.block_size == 32
    item = ds[0]
    assert item["input_ids"].dtype == item["labels"].dtype == torch.long
    batch = causal_lm_collator([ds[i] for i in range(4)])
    assert set(batch) == {"input_ids", "labels"}  # blocks are never padded: no mask (issue 23, item 6)
    for value in batch.values():
        assert value.shape == (4, 32) and value.dtype == torch.long
    assert torch.equal(batch["labels"], batch["input_ids"])
    # plain lists work too; labels default to the inputs
    assert torch.equal(causal_lm_collator([{"input_ids": [1, 2, 3]}])["labels"], torch.tensor([[1, 2, 3]]))
    loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=causal_lm_collator)
    assert next(iter(loader))["input_ids"].shape == (3, 32)
    assert len(BlockDataset([])) == 0
    with pytest.raises(ValueError, match="equal-length"):
        causal_lm_collator([{"input_ids": [1, 2]}, {"input_ids": [1, 2, 3]}])


# --------------------------------------------------------------------------- models


def test_tiny_gpt2_builds_offline_and_starts_near_uniform(tokenizer, no_network):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(data.TINY_GPT2_DIR)
    assert (config.model_type, config.n_layer, config.n_head, config.n_embd, config.n_positions) == (
        "gpt2",
        2,
        2,
        64,
        256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ds = BlockDataset.from_texts(_lines(CORPUS / "validation.txt"), tokenizer, block_size=128)
    batch = causal_lm_collator([ds[i] for i in range(4)])
    model.eval()
    with torch.no_grad():
        out = model(**batch)
    assert out.logits.shape == (4, 128, config.vocab_size)
    loss = out.loss.item()
    assert math.isfinite(loss)
    assert abs(loss - math.log(config.vocab_size)) < 0.3  # ln(1024) = 6.93 at init


def test_small_gpt2_trains_a_step_with_gradient_checkpointing(tokenizer, no_network):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(data.SMALL_GPT2_DIR)
    assert (config.n_layer, config.n_embd, config.n_positions, config.vocab_size) == (4, 128, 512, len(tokenizer))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    # transformers 5.x renamed it (the old name warns); 4.x only has the old one
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    model.train()
    ds = BlockDataset.from_texts(_lines(CORPUS / "validation.txt"), tokenizer, block_size=64)
    batch = causal_lm_collator([ds[i] for i in range(2)])
    loss = model(**batch).loss
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- hub datasets


def test_load_dataset_by_name_without_datasets_says_use_files(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError) as info:
        load_dataset_by_name("wikitext", "wikitext-2-raw-v1")
    assert "--dataset_name" in str(info.value) and "--train_file/--validation_file" in str(info.value)


class _FakeSplit:
    def __init__(self, rows):
        self.rows = rows
        self.column_names = list(rows[0]) if rows else []

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, key):
        return self.rows[key] if isinstance(key, int) else [row[key] for row in self.rows]


def test_load_dataset_by_name_through_datasets(monkeypatch):
    calls = []

    def load_dataset(name, config_name=None):
        calls.append((name, config_name))
        if name == "offline/thing":
            raise ConnectionError("Couldn't reach 'offline/thing' on the Hub (LocalEntryNotFoundError)")
        rows = [{"id": i, "body": f"line {i}" if i % 5 else ""} for i in range(50)]
        return {"train": _FakeSplit(rows)}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    splits = load_dataset_by_name("some/corpus", "cfg", validation_split_percentage=10)
    assert calls[0] == ("some/corpus", "cfg")
    assert len(splits["train"]) + len(splits["validation"]) == 40  # blank rows dropped
    assert splits["validation"] == ["line 1", "line 2", "line 3", "line 4"]
    with pytest.raises(DataError, match="needs the Hugging Face hub") as info:
        load_dataset_by_name("offline/thing", None)
    assert "--train_file/--validation_file" in str(info.value)
