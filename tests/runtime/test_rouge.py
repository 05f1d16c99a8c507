"""ROUGE as the rouge-score package computes it, checked on values worked out by hand."""

from __future__ import annotations

import pytest

from gaudi_launch.runtime.rouge import corpus_rouge, lcs_length, rouge_scores, tokenize


def test_the_rouge_score_readme_example():
    # rouge-score's README: target "The quick brown fox jumps over the lazy dog", prediction
    # "The quick brown dog jumps on the log." -> rouge1 P 0.75 R 0.667 F 0.7059, rougeL P 0.625 R 0.556.
    got = rouge_scores("The quick brown dog jumps on the log.", "The quick brown fox jumps over the lazy dog")
    assert got["rouge1"] == pytest.approx(2 * 0.75 * (6 / 9) / (0.75 + 6 / 9))
    assert got["rougeL"] == pytest.approx(2 * 0.625 * (5 / 9) / (0.625 + 5 / 9))
    # bigrams: "the quick", "quick brown" shared of 7 and 8 -> P 2/7, R 2/8
    assert got["rouge2"] == pytest.approx(2 * (2 / 7) * (2 / 8) / (2 / 7 + 2 / 8))


def test_tokens_counts_and_edges():
    assert tokenize("It's 3 o'clock, ROUGE-L!") == ["it", "s", "3", "o", "clock", "rouge", "l"]
    assert rouge_scores("a a a", "a")["rouge1"] == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))  # clipped counts
    assert rouge_scores("", "a b") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    assert lcs_length("abcbdab", "bdcaba") == 4
    assert rouge_scores("same words here", "same words here") == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}


def test_corpus_figures_are_mean_f1_times_100():
    assert corpus_rouge(["a b", "c"], ["a b", "d"]) == {"rouge1": 50.0, "rouge2": 50.0, "rougeL": 50.0}
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        corpus_rouge(["a", "b"], ["a"])
