#!/usr/bin/env python3
"""Rebuild the shipped tokenizer and the tiny GPT-2 configs in gaudi_launch/runtime/assets/.

    python scripts/build_tokenizer.py           # rewrite the files
    python scripts/build_tokenizer.py --check   # exit 1 if the files on disk differ from a rebuild

The tokenizer is a byte-level BPE (GPT-2 style: every byte is in the alphabet, so any
text encodes and decodes back unchanged) trained with the `tokenizers` library on
assets/corpus/train.txt, with one special token, <|endoftext|> (id 0), used as bos, eos
and pad. Training is single-threaded so that the merges, and hence the files, come out
the same on every run and machine. The model configs take their vocab size and token ids
from the tokenizer, so they are written here as well. Needs only `tokenizers`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

# Before importing tokenizers: its rayon thread pool reads this once.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "gaudi_launch" / "runtime" / "assets"
EOS = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 1024

# n_positions bounds the block size a model can train on. Dropout is off so that runs
# (and runs with and without gradient checkpointing) are exactly comparable.
MODELS = {
    "tiny-gpt2": {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 256},
    "small-gpt2": {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 512},
}


def corpus_lines(path: Path) -> list[str]:
    """The training texts: one per non-blank line, as data.load_text_files reads them."""
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def train_tokenizer(lines: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def _json(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def build_files(vocab_size: int) -> dict[str, str]:
    """Relative path under assets/ -> file content."""
    tok = train_tokenizer(corpus_lines(ASSETS / "corpus" / "train.txt"), vocab_size)
    eos_id = tok.token_to_id(EOS)
    actual_vocab = tok.get_vocab_size(with_added_tokens=True)
    files = {"tokenizer/tokenizer.json": tok.to_str(pretty=True) + "\n"}
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}
    files["tokenizer/special_tokens_map.json"] = _json(special)
    files["tokenizer/tokenizer_config.json"] = _json(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {
                str(eos_id): {
                    "content": EOS,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": True,
                }
            },
        }
    )
    for name, dims in MODELS.items():
        config = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": actual_vocab,
            **dims,
            "n_inner": None,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "layer_norm_epsilon": 1e-05,
            "initializer_range": 0.02,
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": eos_id,
            "tie_word_embeddings": True,
            "use_cache": True,
        }
        files[f"{name}/config.json"] = _json(config)
    return files


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--check", action="store_true", help="compare with the files on disk; write nothing")
    args = parser.parse_args(argv)

    files = build_files(args.vocab_size)
    stale = [
        rel
        for rel, text in files.items()
        if not (ASSETS / rel).is_file() or (ASSETS / rel).read_text(encoding="utf-8") != text
    ]
    if args.check:
        for rel in stale:
            print(f"out of date: {ASSETS / rel}", file=sys.stderr)
        return 1 if stale else 0
    for rel in stale:
        path = ASSETS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
        print(f"wrote {path}")
    vocab = json.loads(files["tiny-gpt2/config.json"])["vocab_size"]
    print(f"vocab size {vocab}; {len(files) - len(stale)} file(s) already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
