"""ROUGE-1, ROUGE-2 and ROUGE-L F-measures, as the rouge-score package computes them (no stemming).

Tokens: lower-cased text with every run of characters other than a-z and 0-9 as a separator
(rouge-score's default tokenizer). ROUGE-N: clipped n-gram overlap; ROUGE-L: the longest common
subsequence. Each score is the F1 of precision and recall; corpus figures are the mean over pairs,
times 100, as the summarization examples report them. Pure Python, no dependency.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return [t for t in _NON_ALNUM.split(text.lower()) if t]


def _f1(overlap: int, n_pred: int, n_ref: int) -> float:
    if overlap == 0 or n_pred == 0 or n_ref == 0:
        return 0.0
    precision, recall = overlap / n_pred, overlap / n_ref
    return 2 * precision * recall / (precision + recall)


def rouge_n(prediction: Sequence[str], reference: Sequence[str], n: int) -> float:
    pred = Counter(tuple(prediction[i : i + n]) for i in range(len(prediction) - n + 1))
    ref = Counter(tuple(reference[i : i + n]) for i in range(len(reference) - n + 1))
    overlap = sum((pred & ref).values())
    return _f1(overlap, sum(pred.values()), sum(ref.values()))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, 1):
            prev_diag, row[j] = row[j], prev_diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(prediction: Sequence[str], reference: Sequence[str]) -> float:
    return _f1(lcs_length(prediction, reference), len(prediction), len(reference))


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    pred, ref = tokenize(prediction), tokenize(reference)
    return {"rouge1": rouge_n(pred, ref, 1), "rouge2": rouge_n(pred, ref, 2), "rougeL": rouge_l(pred, ref)}


def corpus_rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 × 100 over the pairs."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    scores = [rouge_scores(p, r) for p, r in zip(predictions, references)]
    return {k: round(100 * sum(s[k] for s in scores) / len(scores), 4) for k in scores[0]}
