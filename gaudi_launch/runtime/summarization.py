"""A small summarization set made from the shipped corpus, and its seq2seq batches (scripts/run_summarization.py).

The corpus is Aesop's fables: a title line in capitals, then the fable. Each fable becomes one pair:
the fable's text as the document and its first sentence as the summary (a lead summary), so the set
needs no download and a model can learn it.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

from .masks import mask_if_padded

IGNORE = -100
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s")


def fable_pairs(lines: Sequence[str]) -> list[dict[str, str]]:
    """[{"document", "summary"}] from corpus lines: a line of capitals starts a fable."""
    pairs, body = [], []

    def close():
        text = " ".join(body).strip()
        if text:
            first = _SENTENCE_END.split(text, maxsplit=1)[0].strip()
            pairs.append({"document": text, "summary": first})

    for line in lines:
        line = line.strip()
        if line and line.upper() == line and any(c.isalpha() for c in line):
            close()
            body = []
        elif line:
            body.append(line)
    close()
    return pairs


def read_pairs(
    path: str, text_column: Optional[str] = None, summary_column: Optional[str] = None
) -> list[dict[str, str]]:
    """[{"document", "summary"}] from a .csv or JSON-lines (.json/.jsonl) file, as optimum-habana's
    run_summarization reads --train_file/--validation_file: the named columns, else the first two."""
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    elif path.endswith((".json", ".jsonl")):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        raise ValueError(f"{path}: expected a .csv, .json or .jsonl file (one document and its summary a row)")
    if not rows:
        raise ValueError(f"{path}: no rows")
    names = list(rows[0])
    text, summary = text_column or names[0], summary_column or (names[1] if len(names) > 1 else "")
    missing = [c for c in (text, summary) if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(names)})")
    return [{"document": str(r[text]), "summary": str(r[summary])} for r in rows]


def encode_pairs(
    pairs: Sequence[Mapping[str, str]], tokenizer, max_source: int, max_target: int, prefix: str = "summarize: "
) -> list[dict[str, list[int]]]:
    """Token ids of documents (with T5's task prefix) and summaries, cut to length, eos-terminated."""
    eos = tokenizer.eos_token_id
    out = []
    for pair in pairs:
        src = tokenizer(prefix + pair["document"], add_special_tokens=False)["input_ids"][: max_source - 1] + [eos]
        tgt = tokenizer(pair["summary"], add_special_tokens=False)["input_ids"][: max_target - 1] + [eos]
        out.append({"input_ids": src, "labels": tgt})
    return out


class Seq2SeqCollator:
    """Pads sources with the pad id and targets with -100 (ignored by the loss; `label_pad` otherwise, as
    --ignore_pad_token_for_loss false asks), to the batch's longest or to fixed lengths (static shapes for
    HPU lazy mode: --pad_to_max_length)."""

    def __init__(self, pad_id: int, max_source: int = 0, max_target: int = 0, label_pad: int = IGNORE):
        self.pad_id, self.max_source, self.max_target, self.label_pad = pad_id, max_source, max_target, label_pad

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        src_len = self.max_source or max(len(f["input_ids"]) for f in features)
        tgt_len = self.max_target or max(len(f["labels"]) for f in features)
        ids = torch.full((len(features), src_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full((len(features), tgt_len), self.label_pad, dtype=torch.long)
        for i, f in enumerate(features):
            n, m = len(f["input_ids"]), len(f["labels"])
            ids[i, :n] = torch.as_tensor(f["input_ids"])
            mask[i, :n] = 1
            labels[i, :m] = torch.as_tensor(f["labels"])
        batch = {"input_ids": ids, "labels": labels}
        padded = mask_if_padded(mask)  # none where nothing is padded: it would change nothing (runtime/masks.py)
        return batch if padded is None else {**batch, "attention_mask": padded}


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: Sequence[Any]):
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]
