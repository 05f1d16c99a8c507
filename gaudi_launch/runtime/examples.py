"""The flow the example scripts share (run_clm, run_mlm, run_summarization), as optimum-habana's do it:
evaluate before, train, save the model and tokenizer, evaluate after, write results.json (rank 0)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

from gaudi_launch import safewrite


def note(text: str) -> None:
    """A notice about the whole run (not one rank's): written once, by rank 0, to stderr."""
    if os.environ.get("RANK", "0") in ("", "0"):
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def refusing_bad_configs(script: str) -> Iterator[None]:
    """A --deepspeed config that contradicts the flags (ds_config.DeepSpeedConfigError, raised before any
    training) ends the script with its message and exit status 2, not a traceback."""
    from gaudi_launch.runtime.ds_config import DeepSpeedConfigError

    try:
        yield
    except DeepSpeedConfigError as exc:
        print(f"{script}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def saved_tokenizer(model_dir: Optional[str]) -> Optional[str]:
    """A model directory these scripts saved carries its tokenizer; use it rather than the shipped one."""
    if model_dir and os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        return model_dir
    return None


def train_and_evaluate(
    trainer,
    tokenizer,
    args,
    results: Optional[dict[str, Any]] = None,
    extra_eval: Optional[Callable[[], dict[str, Any]]] = None,
) -> dict[str, Any]:
    """Run the script's --do_eval/--do_train; ``extra_eval`` adds to each evaluation (e.g. ROUGE of
    generated text). Returns the results, which rank 0 also prints and writes to results.json."""
    results = dict(results or {})

    def evaluate() -> dict[str, Any]:
        metrics = trainer.evaluate()
        if extra_eval is not None:
            metrics.update(extra_eval())
        return metrics

    if args.do_eval:
        results["eval_before"] = evaluate()
    if args.do_train:
        results["train"] = trainer.train().metrics
        # What the multi-node guide evaluates afterwards on one node: --model_name_or_path <output_dir>.
        import transformers

        transformers.utils.logging.disable_progress_bar()  # a progress bar per save is noise in rank logs
        trainer.save_model()
        if trainer.rank == 0:
            tokenizer.save_pretrained(args.output_dir)
    if args.do_eval:
        results["eval"] = evaluate()
    if trainer.rank == 0:
        print(json.dumps(results, indent=2, sort_keys=True))
        os.makedirs(args.output_dir, exist_ok=True)
        # renamed into place: a link planted in a shared output_dir is replaced, not written through
        safewrite.write_whole(
            os.path.join(args.output_dir, "results.json"), json.dumps(results, indent=2, sort_keys=True)
        )
    return results
