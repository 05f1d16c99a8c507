"""Checkpoints that are either complete or absent: save, find the newest, resume.

Layout of ``output_dir/checkpoint-<step>/``: ``model.pt``, ``optimizer.pt``, ``scheduler.pt``
(state dicts), ``trainer_state.json`` (step, sampler_state, extra) and ``rng-<rank>.pt`` per
rank. Under DeepSpeed, ``deepspeed/`` (the engine's own checkpoint: the model and every rank's
ZeRO partition of the optimizer, and of the weights under ZeRO-3) takes the place of
``model.pt`` and ``optimizer.pt``. Everything is written into
``output_dir/.tmp-checkpoint-<step>-<pid>`` first and renamed into place only once every rank
has finished, so a crash mid-save (or a preempted job) never leaves a ``checkpoint-*``
directory that resuming would trip over. Temp directories left by a crash are ignored by
:func:`latest_checkpoint`; they are not deleted automatically, because on a shared filesystem
another job could be writing one.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist

_NAME = re.compile(r"^checkpoint-(\d+)$")
MODEL, OPTIMIZER, SCHEDULER, STATE = "model.pt", "optimizer.pt", "scheduler.pt", "trainer_state.json"
DEEPSPEED = "deepspeed"  # the engine's checkpoint tag: its subdirectory of checkpoint-N


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the file."""


def _rng_file(rank: int) -> str:
    return f"rng-{rank}.pt"


def _save(obj: Any, path: str) -> None:
    # fsync so that the rename publishing the checkpoint cannot outlive its contents on power loss.
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def to_host(obj: Any) -> Any:
    """A copy of a state dict (nested dicts/lists/tuples) with every tensor on the CPU: checkpoints
    and saved models hold host tensors whatever device trained them (optimum-habana saves HPU
    state the same way; safetensors needs host storage)."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, to_host(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and all of Windows) refuse fsync on directories
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        # Plain ints rather than an ndarray, so the file loads with weights_only=True.
        state["numpy"] = (kind, [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    hpu = getattr(torch, "hpu", None)  # present once habana_frameworks.torch is imported
    if hpu is not None and hasattr(hpu, "get_rng_state_all") and hpu.is_available():
        state["hpu"] = hpu.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    # random.setstate insists on tuples; rebuild them rather than trusting the file's containers.
    random.setstate((python[0], tuple(python[1]), python[2]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            kind, keys, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    hpu = getattr(torch, "hpu", None)
    if "hpu" in state and hpu is not None and hasattr(hpu, "set_rng_state_all") and hpu.is_available():
        hpu.set_rng_state_all(state["hpu"])


def _distributed(world: int) -> bool:
    if world <= 1:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        # Without a process group rank 0 cannot know when the others have written their files.
        raise RuntimeError(f"save_checkpoint with world={world} needs an initialised process group")
    return True


def _checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint-N directory, oldest first."""
    found = []
    try:
        names = os.listdir(output_dir)
    except FileNotFoundError:
        return []
    for name in names:
        m = _NAME.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isdir(path):
            found.append((int(m.group(1)), path))
    return sorted(found)


def _remove(path: str, output_dir: str) -> None:
    # Rename first: if deletion dies halfway, what is left is not named checkpoint-* any more.
    doomed = os.path.join(output_dir, f".del-{os.path.basename(path)}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _rotate(output_dir: str, keep_path: str, total_limit: int) -> None:
    others = [p for _, p in _checkpoints(output_dir) if os.path.abspath(p) != os.path.abspath(keep_path)]
    # The checkpoint just written always survives, even if older-numbered ones exist (a rerun
    # from an earlier step into the same output_dir): deleting it would make the save pointless.
    for path in others[: max(0, len(others) - (total_limit - 1))]:
        _remove(path, output_dir)


def _os_error(exc: BaseException) -> Optional[OSError]:
    """The OSError behind a failed write: torch.save's zip writer reports a full disk as a
    RuntimeError raised while handling it."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def save_checkpoint(
    output_dir: str,
    step: int,
    *,
    model: Optional[torch.nn.Module],
    optimizer: Optional[torch.optim.Optimizer],
    scheduler: Any,
    sampler_state: dict,
    extra: Optional[dict] = None,
    total_limit: Optional[int] = None,
    rank: int = 0,
    world: int = 1,
    engine: Any = None,
) -> str:
    """Write ``output_dir/checkpoint-<step>`` atomically and return its path (on every rank).

    Every rank must call it (with a process group when ``world > 1``): each saves its own RNG
    state, rank 0 saves the rest, renames the directory into place and, with ``total_limit``,
    deletes all but the newest ``total_limit`` checkpoints. With a DeepSpeed ``engine`` every
    rank also writes its ZeRO partition through the engine's save_checkpoint (pass model and
    optimizer as None: rank 0's state dicts would hold only its own partition).
    """
    if total_limit is not None and total_limit < 1:
        raise ValueError(f"total_limit must be at least 1 (or None for no limit), got {total_limit}")
    distributed = _distributed(world)
    final = os.path.join(output_dir, f"checkpoint-{step}")

    tmp: Optional[str] = None
    if rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        tmp = os.path.join(output_dir, f".tmp-checkpoint-{step}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of this very pid: start clean
        os.makedirs(tmp)
    if distributed:
        # Also the barrier that makes sure the directory exists before other ranks write into it.
        box = [tmp]
        dist.broadcast_object_list(box, src=0)
        tmp = box[0]
    assert tmp is not None

    writing = tmp
    try:
        writing = os.path.join(tmp, _rng_file(rank))
        _save(_rng_state(), writing)
        if engine is not None:
            writing = os.path.join(tmp, DEEPSPEED)
            # A collective: every rank writes its own partition files into the tag directory.
            engine.save_checkpoint(tmp, tag=DEEPSPEED, save_latest=False)
        if rank == 0:
            if model is not None:
                writing = os.path.join(tmp, MODEL)
                _save(to_host(model.state_dict()), writing)
            if optimizer is not None:
                writing = os.path.join(tmp, OPTIMIZER)
                _save(to_host(optimizer.state_dict()), writing)
            if scheduler is not None:
                writing = os.path.join(tmp, SCHEDULER)
                _save(scheduler.state_dict(), writing)
            state = {"step": step, "sampler_state": sampler_state, "extra": extra or {}}
            writing = os.path.join(tmp, STATE)
            with open(writing, "w") as f:
                json.dump(state, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
    except BaseException as exc:
        if rank == 0 and not distributed:
            # Other ranks may still be writing into it in the distributed case; the crash takes
            # the job down anyway and the leftover is ignored by latest_checkpoint.
            shutil.rmtree(tmp, ignore_errors=True)
        os_error = _os_error(exc)
        if os_error is not None:  # e.g. disk full: say where, and that nothing older was touched
            kept = latest_checkpoint(output_dir)
            raise CheckpointError(
                f"saving checkpoint-{step} failed writing {writing}: "
                f"{os_error.strerror or os_error}; "
                f"{'the previous checkpoint ' + kept + ' is kept' if kept else 'no older checkpoint exists'}"
            ) from exc
        raise

    if distributed:
        dist.barrier()  # every rank's RNG file is in place
    if rank == 0:
        _fsync_dir(tmp)
        if os.path.exists(final):
            # Saving the same step again (a resumed run): swap, never leaving checkpoint-N half-written.
            _remove(final, output_dir)
        os.rename(tmp, final)
        _fsync_dir(output_dir)
        if total_limit is not None:
            _rotate(output_dir, final, total_limit)
    if distributed:
        dist.barrier()  # nobody looks for the checkpoint before it has its final name
    return final


def complete_checkpoints(output_dir: str) -> list[str]:
    """Every complete ``checkpoint-N`` in ``output_dir``, newest (by N) first."""
    # Renaming makes every checkpoint-N complete; the check guards against directories that
    # some other tool (or a person) put there.
    return [
        path
        for _, path in reversed(_checkpoints(output_dir))
        if os.path.isfile(os.path.join(path, STATE))
        and (os.path.isfile(os.path.join(path, MODEL)) or os.path.isdir(os.path.join(path, DEEPSPEED)))
    ]


def latest_checkpoint(output_dir: str) -> Optional[str]:
    """The newest complete ``checkpoint-N`` (by N) in ``output_dir``, or None."""
    found = complete_checkpoints(output_dir)
    return found[0] if found else None


class _WeightsOnlyEngine:
    """A DeepSpeed checkpoint engine whose loads are weights_only (DeepSpeed's own unpickles
    anything), allowing by name only the classes DeepSpeed pickles besides tensors and
    containers: its loss scalers, its ZeRO stage enum and its partitions' fragment addresses."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def load(self, path: str, map_location: Any = None) -> Any:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        with torch.serialization.safe_globals([LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]):
            return torch.load(path, map_location=map_location, weights_only=True)


def _load_engine(path: str, engine: Any) -> None:
    """Every rank reads its own partition back through the engine (a collective)."""
    shards = os.path.join(path, DEEPSPEED)
    if not os.path.isdir(shards):
        raise CheckpointError(
            f"{path} was saved without --deepspeed (it has no {DEEPSPEED}/ directory): resume it without "
            "--deepspeed, or start this DeepSpeed run afresh"
        )
    inner = engine.checkpoint_engine
    engine.checkpoint_engine = _WeightsOnlyEngine(inner)
    try:
        loaded, _ = engine.load_checkpoint(path, tag=DEEPSPEED, load_optimizer_states=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
        raise CheckpointError(
            f"{shards} cannot be loaded: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    finally:
        engine.checkpoint_engine = inner
    if loaded is None:  # DeepSpeed only logs what it did not find
        raise CheckpointError(f"{shards} cannot be loaded: DeepSpeed found no checkpoint there")


def load_checkpoint(
    path: str,
    *,
    model: Optional[torch.nn.Module],
    optimizer: Optional[torch.optim.Optimizer] = None,
    scheduler: Any = None,
    rank: int = 0,
    map_location: Any = "cpu",
    engine: Any = None,
) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG from ``path``; return trainer_state.

    With a DeepSpeed ``engine`` (every rank must call it then) the engine restores the model and
    its optimizer from ``deepspeed/``; pass model and optimizer as None.
    """

    # weights_only: a checkpoint directory should never be able to run code on load.
    def load(name: str, where: Any = map_location) -> Any:
        file = os.path.join(path, name)
        try:
            return torch.load(file, map_location=where, weights_only=True)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            # A truncated or damaged file (a crash or a full disk outside our atomic save).
            raise CheckpointError(
                f"{file} cannot be loaded: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from exc

    if (
        engine is None
        and not os.path.isfile(os.path.join(path, MODEL))
        and os.path.isdir(os.path.join(path, DEEPSPEED))
    ):
        raise CheckpointError(f"{path} holds a DeepSpeed checkpoint (in {DEEPSPEED}/): resume it with --deepspeed")
    # Everything of ours is read before anything is applied: a bad file leaves the model as it was
    # (the engine's own files come last).
    model_state = load(MODEL) if model is not None else None
    optimizer_state = load(OPTIMIZER) if optimizer is not None else None
    scheduler_state = load(SCHEDULER) if scheduler is not None else None
    try:
        with open(os.path.join(path, STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{os.path.join(path, STATE)} cannot be read: {exc}") from exc
    if engine is not None:
        _load_engine(path, engine)
    if model is not None:
        model.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    if scheduler is not None:
        scheduler.load_state_dict(scheduler_state)
    rng_path = os.path.join(path, _rng_file(rank))
    if os.path.isfile(rng_path):
        # RNG states are CPU byte tensors whatever device the model lives on.
        _set_rng_state(load(_rng_file(rank), "cpu"))
    else:
        warnings.warn(
            f"{rng_path} is missing (resuming on more ranks than saved?): rank {rank} keeps its "
            "current random state, so the run will not repeat the original one exactly"
        )
    return state
