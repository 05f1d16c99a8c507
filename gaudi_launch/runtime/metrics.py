"""Throughput accounting and metric logging (JSON lines, optional TensorBoard, console)."""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

from gaudi_launch import safewrite


class Throughput:
    """samples/s, tokens/s, steps/s excluding the first `warmup_steps` steps (graph compilation) — the clock restarts after them and their samples/tokens are not counted.

    On Gaudi the first steps compile graphs and can take minutes; counting them would report a
    throughput the job never actually runs at (optimum-habana's ``throughput_warmup_steps``).
    The clock starts when the object is created, so create it right before the first step.
    ``train_runtime`` is the whole time from creation to the last step, warm-up included (as in
    HF/optimum-habana); only the rates use the measured window.
    """

    def __init__(self, warmup_steps: int = 0, clock: Callable[[], float] = time.perf_counter) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        self._clock = clock
        self._started = clock()
        self._window_start = self._started  # restarted at the end of the last warm-up step
        self._last = self._started
        self._steps = 0  # all steps, warm-up included
        self._samples = 0  # measured steps only
        self._tokens = 0
        self._paused = 0.0  # time spent in pause() since the last step

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Leave what runs inside (evaluation during training) out of the rates."""
        start = self._clock()
        try:
            yield
        finally:
            self._paused += self._clock() - start

    def step(self, samples: int, tokens: int = 0) -> None:
        """Record one optimizer step; call at its END (after the optimizer step / mark_step)."""
        now = self._clock()
        self._steps += 1
        self._last = now
        paused, self._paused = self._paused, 0.0
        if self._steps <= self.warmup_steps:
            self._window_start = now
            return
        # A pause between two measured steps moves the window's start by its length; one after
        # the last step is outside the window already.
        self._window_start += paused
        self._samples += samples
        self._tokens += tokens

    @property
    def measured_steps(self) -> int:
        return max(0, self._steps - self.warmup_steps)

    def metrics(self) -> dict[str, float]:
        steps = self.measured_steps
        window = self._last - self._window_start
        runtime = self._last - self._started
        if steps == 0 or window <= 0:
            rates = (0.0, 0.0, 0.0)
        else:
            rates = (self._samples / window, self._tokens / window, steps / window)
        return {
            "train_samples_per_second": rates[0],
            "train_tokens_per_second": rates[1],
            "train_steps_per_second": rates[2],
            "train_runtime": runtime,
            "measured_steps": steps,
            "measured_samples": self._samples,
        }


def _plain(value: Any) -> Any:
    """A JSON-safe scalar: tensors and numpy scalars unwrapped, NaN/inf spelled as strings."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()  # 0-d tensor / numpy scalar; a device tensor syncs here, once per log
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        # Strict JSON has no NaN/Infinity; a diverged loss must still show up readably.
        return value if math.isfinite(value) else str(value)
    return str(value)


class MetricsWriter:
    """JSON lines in output_dir/metrics.jsonl (rank 0 only; other ranks no-op), plus TensorBoard scalars when torch.utils.tensorboard imports (tensorboard installed), else silently none."""

    def __init__(self, output_dir: str, rank: int = 0, tensorboard: bool = True) -> None:
        self.path: Optional[str] = None
        self._file = None
        self._tb = None
        if rank != 0:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.jsonl")
        # Append: a resumed run continues the same file rather than wiping its history.
        # A shared output_dir: never through a planted link, only a plain file of ours (safewrite.py).
        self._file = safewrite.open_own(self.path, append=True, mode=0o644)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass  # optional: tensorboard is not a dependency
            else:
                self._tb = SummaryWriter(log_dir=os.path.join(output_dir, "tensorboard"))

    def log(self, step: int, values: dict) -> None:
        if self._file is None:
            return
        record = {"step": int(step)}
        record.update({str(k): _plain(v) for k, v in values.items()})
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()  # a crashed job keeps every line logged before the crash
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, global_step=int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fmt(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, float):
        # 4 significant digits read well for losses and learning rates; rates in the thousands
        # would lose their units digit to it (1234.5 -> 1234), so those get one decimal instead.
        return f"{value:.1f}" if 1e3 <= abs(value) < 1e7 else f"{value:.4g}"
    return str(value)


def format_log(step: int, values: dict) -> str:
    """One readable line for the console, e.g. ``step 10 | loss 2.346 | lr 0.0001``."""
    parts = [f"step {int(step)}"] + [f"{k} {_fmt(v)}" for k, v in values.items()]
    return " | ".join(parts)
