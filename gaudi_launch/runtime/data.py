"""Data for the causal-LM example, offline: the shipped corpus and tokenizer, plain-text files, blocks.

Nothing here touches the network. The package ships (under ``ASSETS``):

- ``corpus/train.txt`` and ``corpus/validation.txt``: about 80 KB of public-domain English
  (see corpus/README.md), one paragraph per line;
- ``tokenizer/``: a byte-level BPE with 1024 tokens trained on corpus/train.txt, loadable
  with ``AutoTokenizer.from_pretrained``; ``<|endoftext|>`` (id 0) is bos, eos and pad;
- ``tiny-gpt2/config.json`` (2 layers, 64 wide, 256 positions) and ``small-gpt2/config.json``
  (4 layers, 128 wide, 512 positions): GPT-2 configs with that vocabulary and dropout off,
  for ``AutoConfig.from_pretrained`` + ``AutoModelForCausalLM.from_config``.

``scripts/build_tokenizer.py`` rebuilds the tokenizer and the configs.

The pipeline mirrors Hugging Face's run_clm example: texts -> token ids, joined with eos
between documents -> cut into equal blocks (the remainder is dropped) -> labels are the
inputs (the model shifts them). ``transformers`` is imported only by ``load_tokenizer``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from torch.utils.data import Dataset

from gaudi_launch.errors import UserError

ASSETS: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
CORPUS_DIR: str = os.path.join(ASSETS, "corpus")
TOKENIZER_DIR: str = os.path.join(ASSETS, "tokenizer")
TINY_GPT2_DIR: str = os.path.join(ASSETS, "tiny-gpt2")
SMALL_GPT2_DIR: str = os.path.join(ASSETS, "small-gpt2")
EOS_TOKEN = "<|endoftext|>"
BUILTIN = "builtin"

_HUB_HINT = "the Hugging Face hub is not reachable here; pass a local directory"
_DATA_FILE_HINT = (
    "use --train_file/--validation_file with local plain-text .txt files "
    "(or no data options at all for the built-in corpus)"
)


class DataError(UserError, ValueError):
    """A data or tokenizer option that cannot be satisfied offline. Both a ``UserError`` (the
    launcher prints it without a traceback) and a ``ValueError``."""


# --------------------------------------------------------------------------- tokenizer


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that is not on disk is a missing path."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.endswith(".json")
        or name.count("/") > 1
        or "\\" in name
    )


def _ensure_special_tokens(tokenizer):
    if tokenizer.eos_token is None and EOS_TOKEN in tokenizer.get_vocab():
        tokenizer.eos_token = EOS_TOKEN
    if tokenizer.bos_token is None and tokenizer.eos_token is not None:
        tokenizer.bos_token = tokenizer.eos_token
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # GPT-2 convention; blocks never need padding
    return tokenizer


def load_tokenizer(name_or_path: Optional[str] = None):
    """A ``transformers`` fast tokenizer, loaded without the network.

    ``None`` or ``"builtin"``: the shipped tokenizer (``TOKENIZER_DIR``). A directory: whatever
    ``AutoTokenizer.from_pretrained`` finds in it. A ``tokenizer.json`` file (any ``*.json``):
    wrapped in ``PreTrainedTokenizerFast``. Anything else is taken as a hub name, which only
    works if it is already in the local Hugging Face cache; otherwise a ``DataError`` says to
    pass a local directory. The result always has eos set, and pad/bos default to eos.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name_or_path is None or name_or_path == BUILTIN:
        name_or_path = TOKENIZER_DIR
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError...
            raise DataError(
                f"cannot load a tokenizer from directory {path}: {type(e).__name__}: {e}",
                where="--tokenizer_name",
                hint="the directory needs tokenizer.json (and tokenizer_config.json), "
                "or the vocab/merges files of a slow tokenizer",
            ) from None
    elif os.path.isfile(path):
        if not path.endswith(".json"):
            raise DataError(f"{path} is not a tokenizer.json file or a tokenizer directory", where="--tokenizer_name")
        try:
            tokenizer = PreTrainedTokenizerFast(tokenizer_file=path)
        except Exception as e:  # noqa: BLE001
            raise DataError(
                f"cannot load {path} as a tokenizers JSON file: {type(e).__name__}: {e}", where="--tokenizer_name"
            ) from None
    elif _looks_like_path(name_or_path):
        raise DataError(f"no such tokenizer file or directory: {path}", where="--tokenizer_name")
    else:
        try:  # a hub name is fine if it is already in the local cache
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        except Exception:  # noqa: BLE001
            raise DataError(
                f"tokenizer {name_or_path!r} is neither a local directory nor a file, and it is not in "
                f"the local Hugging Face cache: {_HUB_HINT} (with tokenizer.json) or a tokenizer.json file",
                where="--tokenizer_name",
                hint=f"omit it (or pass {BUILTIN!r}) for the built-in tokenizer in {TOKENIZER_DIR}",
            ) from None
    return _ensure_special_tokens(tokenizer)


# --------------------------------------------------------------------------- text files


def read_text_file(path: str) -> list[str]:
    """The examples in a plain-text file: one per non-blank line (blank lines only separate)."""
    if not os.path.isfile(path):
        raise DataError(f"no such file: {path}")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".txt", ".text", ""):
        raise DataError(
            f"{path}: only plain-text .txt files are supported (one paragraph per line), not {ext}",
            hint="convert it to text, one document or paragraph per line",
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text: {e}") from None
    return [line for line in text.splitlines() if line.strip()]


def _split_off_validation(texts: list[str], percentage: int) -> dict[str, list[str]]:
    """run_clm's convention: validation is the first ``percentage`` % of the examples, train the rest."""
    n = len(texts) * percentage // 100
    if percentage > 0 and n == 0 and len(texts) >= 2:
        n = 1
    return {"train": texts[n:], "validation": texts[:n]}


def _check_percentage(validation_split_percentage: int) -> None:
    if (
        isinstance(validation_split_percentage, bool)
        or not isinstance(validation_split_percentage, int)
        or not 0 <= validation_split_percentage < 100
    ):
        raise DataError(
            f"validation_split_percentage must be an integer from 0 to 99, got {validation_split_percentage!r}",
            where="--validation_split_percentage",
        )


def load_text_files(
    train_file: Optional[str], validation_file: Optional[str], validation_split_percentage: int = 10
) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}``, each a list of texts (non-blank lines).

    No ``train_file``: the shipped corpus (its own validation file unless ``validation_file``
    is given). A ``train_file`` without a ``validation_file``: the first
    ``validation_split_percentage`` % of its lines become validation (at least one line when
    the percentage is above 0; none when it is 0).
    """
    _check_percentage(validation_split_percentage)
    if train_file is None:
        train = read_text_file(os.path.join(CORPUS_DIR, "train.txt"))
        validation = read_text_file(validation_file or os.path.join(CORPUS_DIR, "validation.txt"))
        return {"train": train, "validation": validation}
    texts = read_text_file(train_file)
    if not texts:
        raise DataError(f"{train_file} has no text", where="--train_file")
    if validation_file is not None:
        return {"train": texts, "validation": read_text_file(validation_file)}
    splits = _split_off_validation(texts, validation_split_percentage)
    if not splits["train"]:
        raise DataError(
            f"{train_file} has only {len(texts)} line(s): nothing left to train on after "
            f"splitting off {validation_split_percentage}% for validation",
            where="--train_file",
            hint="pass --validation_file or a lower --validation_split_percentage",
        )
    return splits


# --------------------------------------------------------------------------- blocks


def _encode(texts: Sequence[str], tokenizer) -> tuple:
    """(list of token-id lists, eos id) for a transformers tokenizer or a raw tokenizers.Tokenizer."""
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "token_to_id"):  # tokenizers.Tokenizer
        ids = [enc.ids for enc in tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        return ids, tokenizer.token_to_id(EOS_TOKEN)
    ids = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"] if texts else []
    return ids, tokenizer.eos_token_id


def tokenize_and_group(texts: Sequence[str], tokenizer, block_size: int) -> list[dict[str, list[int]]]:
    """Token ids of all ``texts``, each followed by eos, concatenated and cut into
    ``block_size`` blocks: ``[{"input_ids": [...], "labels": [...]}, ...]``, labels equal to the
    inputs. The tail shorter than a block is dropped, so fewer tokens than ``block_size`` give
    an empty list. ``block_size`` must not exceed the model's ``n_positions``.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise DataError(f"block_size must be a positive integer, got {block_size!r}", where="--block_size")
    ids, eos = _encode(texts, tokenizer)
    if eos is None:
        raise DataError(
            "the tokenizer has no eos token, which separates documents",
            where="--tokenizer_name",
            hint=f"use a tokenizer with {EOS_TOKEN} or set eos_token",
        )
    stream: list[int] = []
    for doc in ids:
        stream.extend(doc)
        stream.append(eos)
    n_blocks = len(stream) // block_size
    blocks = []
    for i in range(n_blocks):
        block = stream[i * block_size : (i + 1) * block_size]
        blocks.append({"input_ids": block, "labels": list(block)})
    return blocks


class BlockDataset(Dataset):
    """Equal-length blocks (from ``tokenize_and_group``) as ``{"input_ids", "labels"}`` LongTensors."""

    def __init__(self, blocks: Sequence[Mapping[str, Sequence[int]]]):
        lengths = {len(b["input_ids"]) for b in blocks} | {len(b.get("labels", b["input_ids"])) for b in blocks}
        if len(lengths) > 1:
            raise ValueError(f"blocks must all have the same length, got lengths {sorted(lengths)}")
        width = lengths.pop() if lengths else 0
        shape = (len(blocks), width)
        self.input_ids = torch.tensor([list(b["input_ids"]) for b in blocks], dtype=torch.long).reshape(shape)
        self.labels = torch.tensor([list(b.get("labels", b["input_ids"])) for b in blocks], dtype=torch.long).reshape(
            shape
        )

    @classmethod
    def from_texts(cls, texts: Sequence[str], tokenizer, block_size: int) -> BlockDataset:
        return cls(tokenize_and_group(texts, tokenizer, block_size))

    @property
    def block_size(self) -> int:
        return self.input_ids.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


def causal_lm_collator(features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack equal-length features into ``input_ids`` and ``labels`` (the inputs when a feature has
    none), each ``(batch, block)`` int64. No ``attention_mask``: blocks are never padded, and an
    all-ones one changes nothing but costs a host read of it in every forward on HPU (runtime/masks.py)."""
    if not features:
        raise ValueError("causal_lm_collator got an empty batch")
    try:
        input_ids = torch.stack([torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features])
        labels = torch.stack(
            [torch.as_tensor(f["labels"] if "labels" in f else f["input_ids"], dtype=torch.long) for f in features]
        )
    except RuntimeError as e:
        raise ValueError(f"causal_lm_collator needs equal-length features (use tokenize_and_group): {e}") from None
    return {"input_ids": input_ids, "labels": labels}


# --------------------------------------------------------------------------- hub datasets


def _text_column(split) -> str:
    names = list(getattr(split, "column_names", []) or [])
    if "text" in names:
        return "text"
    if len(split) > 0:
        row = split[0]
        for name in names:
            if isinstance(row.get(name), str):
                return name
    raise DataError(f"the dataset has no text column (columns: {names})", where="--dataset_name")


def load_dataset_by_name(
    name: str, config_name: Optional[str] = None, validation_split_percentage: int = 10
) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}`` from a Hugging Face dataset, through the
    ``datasets`` library. That needs ``datasets`` installed and the hub reachable (or the
    dataset already cached); otherwise a ``DataError`` says to use --train_file/--validation_file.
    The text column is ``text`` or else the first string column; without a validation split the
    first ``validation_split_percentage`` % of train is used.
    """
    _check_percentage(validation_split_percentage)
    try:
        import datasets  # noqa: F401 - optional; deliberately not a dependency of this project
    except ImportError:
        raise DataError(
            f"--dataset_name {name!r} needs the `datasets` package and the Hugging Face hub, and neither "
            f"is available here",
            where="--dataset_name",
            hint=_DATA_FILE_HINT,
        ) from None
    try:
        loaded = datasets.load_dataset(name, config_name)
    except Exception as e:  # noqa: BLE001 - offline, unknown name, no cache: all the same to the user
        raise DataError(
            f"cannot load dataset {name!r}{f' ({config_name})' if config_name else ''}: {type(e).__name__}: {e}. "
            f"--dataset_name needs the Hugging Face hub, which is not reachable here",
            where="--dataset_name",
            hint=_DATA_FILE_HINT,
        ) from None
    if "train" not in loaded:
        raise DataError(f"dataset {name!r} has no train split (splits: {list(loaded)})", where="--dataset_name")
    train_split = loaded["train"]
    train = [t for t in train_split[_text_column(train_split)] if t and t.strip()]
    if "validation" in loaded:
        val_split = loaded["validation"]
        validation = [t for t in val_split[_text_column(val_split)] if t and t.strip()]
        return {"train": train, "validation": validation}
    return _split_off_validation(train, validation_split_percentage)
