"""Checkpoints that are either complete or absent, in transformers' Trainer layout: save, find the newest, resume.

Layout of ``output_dir/checkpoint-<step>/``, as transformers' ``Trainer._save_checkpoint`` writes it, so that
``from_pretrained(checkpoint-N)`` loads the model and transformers' Trainer resumes from ours (and ours from
its): the model by ``save_pretrained`` (``config.json``, ``model.safetensors``; a module that is no transformers
model: ``model.safetensors`` of its state dict), ``optimizer.pt`` and ``scheduler.pt`` (state dicts),
``rng_state.pth`` (one rank) or ``rng_state_<rank>.pth`` per rank (python, numpy, cpu and the device's RNG), and
``trainer_state.json`` with transformers' ``TrainerState`` fields. What exact resume needs beyond that (the
sampler's position) goes to a file of our own, ``gaudi_launch_state.json``; without it (a transformers
checkpoint) the position follows from the step, as transformers derives it. Under DeepSpeed, ``deepspeed/``
(the engine's own checkpoint: the model and every rank's ZeRO partition of the optimizer, and of the weights
under ZeRO-3) takes the place of the model and ``optimizer.pt``. Everything is written into
``output_dir/.tmp-checkpoint-<step>-<pid>`` first and renamed into place only once every rank has finished, so
a crash mid-save (or a preempted job) never leaves a ``checkpoint-*`` directory that resuming would trip over.
Temp directories left by a crash are ignored by :func:`latest_checkpoint`; they are not deleted automatically,
because on a shared filesystem another job could be writing one. Checkpoints of the earlier layout
(``model.pt``, ``rng-<rank>.pt``) still load.
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
OPTIMIZER, SCHEDULER, STATE = "optimizer.pt", "scheduler.pt", "trainer_state.json"
SAFE_MODEL, BIN_MODEL, OLD_MODEL = "model.safetensors", "pytorch_model.bin", "model.pt"  # transformers', ours before
MODELS = (SAFE_MODEL, BIN_MODEL, OLD_MODEL)
OURS = "gaudi_launch_state.json"  # the exact-resume extras transformers' trainer_state.json has no field for
DEEPSPEED = "deepspeed"  # the engine's checkpoint tag: its subdirectory of checkpoint-N
# transformers' TrainerState fields (trainer_callback.py): its load_from_json takes these and no other key.
TRAINER_STATE_DEFAULTS: dict[str, Any] = {
    "best_global_step": None,
    "best_metric": None,
    "best_model_checkpoint": None,
    "epoch": 0.0,
    "eval_steps": 500,
    "global_step": 0,
    "is_hyper_param_search": False,
    "is_local_process_zero": True,
    "is_world_process_zero": True,
    "log_history": [],
    "logging_steps": 500,
    "max_steps": 0,
    "num_input_tokens_seen": 0,
    "num_train_epochs": 0,
    "save_steps": 500,
    "stateful_callbacks": {},
    "total_flos": 0.0,
    "train_batch_size": None,
    "trial_name": None,
    "trial_params": None,
}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the file."""


def _rng_file(rank: int, world: int) -> str:
    """transformers' name (Trainer._save_rng_state): one file on one rank, one per rank otherwise."""
    return "rng_state.pth" if world <= 1 else f"rng_state_{rank}.pth"


def _rng_files(rank: int) -> list[str]:
    """The names a rank's RNG state may have: transformers' (saved on one rank or several), ours before."""
    return [f"rng_state_{rank}.pth", *(["rng_state.pth"] if rank == 0 else []), f"rng-{rank}.pt"]


def _numpy_globals() -> list:
    """What numpy's RNG state needs to load with weights_only=True (transformers' trainer_pt_utils.safe_globals)."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


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
    """This process's RNG states under transformers' keys (Trainer._save_rng_state)."""
    state: dict[str, Any] = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    hpu = getattr(torch, "hpu", None)  # present once habana_frameworks.torch is imported
    if hpu is not None and hasattr(hpu, "get_rng_state_all") and hpu.is_available():
        state["hpu"] = hpu.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what _rng_state saved (or transformers' file, or our earlier layout's: "torch" for "cpu")."""
    python = state["python"]
    # random.setstate insists on tuples; rebuild them rather than trusting the file's containers.
    random.setstate((python[0], tuple(python[1]), python[2]))
    torch.set_rng_state(state["cpu"] if "cpu" in state else state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            kind, keys, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if torch.is_tensor(cuda):
            torch.cuda.set_rng_state(cuda)
        elif len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    hpu = getattr(torch, "hpu", None)
    if "hpu" in state and hpu is not None and hasattr(hpu, "set_rng_state_all") and hpu.is_available():
        if torch.is_tensor(state["hpu"]):
            hpu.set_rng_state(state["hpu"])
        else:
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


def _write_json(obj: Any, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _save_model(model: torch.nn.Module, folder: str) -> None:
    """The model as transformers' Trainer.save_model writes it: save_pretrained (config.json,
    model.safetensors) for a transformers model, else its state dict in model.safetensors. Host tensors."""
    state = to_host(model.state_dict())
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, state_dict=state)
    else:
        from safetensors.torch import save_model

        save_model(model, os.path.join(folder, SAFE_MODEL), metadata={"format": "pt"})  # tied tensors once
    for name in os.listdir(folder):  # save_pretrained writes without fsync
        if not os.path.isdir(os.path.join(folder, name)):
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())


def _load_model_state(path: str, name: str, map_location: Any) -> dict:
    if name == SAFE_MODEL:
        from safetensors.torch import load_file

        return load_file(os.path.join(path, name), device="cpu")
    return torch.load(os.path.join(path, name), map_location=map_location, weights_only=True)


def _apply_model_state(model: torch.nn.Module, state: dict, where: str) -> None:
    """load_state_dict, where a key left out is a tied weight saved once under another name (save_pretrained
    and safetensors keep one copy of shared tensors), as transformers' _load_from_checkpoint allows."""
    own = model.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    loaded = {own[k].data_ptr() for k in state if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in loaded]
    if untied or unexpected:
        raise CheckpointError(
            f"{where} does not fit this model: missing {', '.join(untied) or 'nothing'}, "
            f"unexpected {', '.join(unexpected) or 'nothing'}"
        )


def _os_error(exc: BaseException) -> Optional[OSError]:
    """The OSError behind a failed write: torch.save's zip writer reports a full disk as a
    RuntimeError raised while handling it, safetensors as its own error saying "(os error N)"."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, OSError):
            return exc
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
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
    trainer_state: Optional[dict] = None,
) -> str:
    """Write ``output_dir/checkpoint-<step>`` atomically and return its path (on every rank).

    Every rank must call it (with a process group when ``world > 1``): each saves its own RNG
    state, rank 0 saves the rest, renames the directory into place and, with ``total_limit``,
    deletes all but the newest ``total_limit`` checkpoints. With a DeepSpeed ``engine`` every
    rank also writes its ZeRO partition through the engine's save_checkpoint (pass model and
    optimizer as None: rank 0's state dicts would hold only its own partition). ``trainer_state``: values
    of transformers' TrainerState fields (the rest get its defaults).
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
        writing = os.path.join(tmp, _rng_file(rank, world))
        _save(_rng_state(), writing)
        if engine is not None:
            writing = os.path.join(tmp, DEEPSPEED)
            # A collective: every rank writes its own partition files into the tag directory.
            engine.save_checkpoint(tmp, tag=DEEPSPEED, save_latest=False)
        if rank == 0:
            if model is not None:
                writing = os.path.join(tmp, SAFE_MODEL)
                _save_model(model, tmp)
            if optimizer is not None:
                writing = os.path.join(tmp, OPTIMIZER)
                _save(to_host(optimizer.state_dict()), writing)
            if scheduler is not None:
                writing = os.path.join(tmp, SCHEDULER)
                _save(scheduler.state_dict(), writing)
            known = {k: v for k, v in (trainer_state or {}).items() if k in TRAINER_STATE_DEFAULTS}
            state = {**TRAINER_STATE_DEFAULTS, **known, "global_step": step}
            writing = os.path.join(tmp, STATE)
            _write_json(state, writing)
            writing = os.path.join(tmp, OURS)
            _write_json({"step": step, "sampler_state": sampler_state, "extra": extra or {}}, writing)
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
        and (_model_file(path) is not None or os.path.isdir(os.path.join(path, DEEPSPEED)))
    ]


def _model_file(path: str) -> Optional[str]:
    """The model file of checkpoint ``path`` (transformers' names, then ours before), or None."""
    return next((name for name in MODELS if os.path.isfile(os.path.join(path, name))), None)


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
    restore_rng: bool = True,
) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG from ``path`` (ours, or transformers'
    Trainer's); return ``{"step", "sampler_state", "extra", "trainer_state"}``: ``sampler_state`` is None
    for a checkpoint without our file (the caller derives the position from the step, as transformers does).
    ``restore_rng=False``: the RNG state is returned under ``"rng"`` instead, for the caller to restore once
    it has built its data iterator (set_rng_state), as transformers' Trainer does.

    With a DeepSpeed ``engine`` (every rank must call it then) the engine restores the model and
    its optimizer from ``deepspeed/``; pass model and optimizer as None.
    """

    def fail(file: str, exc: BaseException) -> CheckpointError:
        # A truncated or damaged file (a crash or a full disk outside our atomic save).
        return CheckpointError(
            f"{file} cannot be loaded: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        )

    # weights_only: a checkpoint directory should never be able to run code on load.
    def load(name: str, where: Any = map_location) -> Any:
        file = os.path.join(path, name)
        try:
            with torch.serialization.safe_globals(_numpy_globals()):  # numpy's RNG state, as transformers
                return torch.load(file, map_location=where, weights_only=True)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            raise fail(file, exc) from exc

    model_name = _model_file(path)
    if engine is None and model_name is None and os.path.isdir(os.path.join(path, DEEPSPEED)):
        raise CheckpointError(f"{path} holds a DeepSpeed checkpoint (in {DEEPSPEED}/): resume it with --deepspeed")
    if model is not None and model_name is None:
        raise CheckpointError(f"{path} has no model file ({', '.join(MODELS)})")
    # Everything of ours is read before anything is applied: a bad file leaves the model as it was
    # (the engine's own files come last).
    model_state = None
    if model is not None:
        try:
            model_state = _load_model_state(path, model_name, map_location)
        except Exception as exc:  # safetensors' own error type too
            raise fail(os.path.join(path, model_name), exc) from exc
    optimizer_state = load(OPTIMIZER) if optimizer is not None else None
    scheduler_state = load(SCHEDULER) if scheduler is not None else None
    try:
        with open(os.path.join(path, STATE)) as f:
            trainer_state = json.load(f)
        ours = None
        if os.path.isfile(os.path.join(path, OURS)):
            with open(os.path.join(path, OURS)) as f:
                ours = json.load(f)
        elif "sampler_state" in trainer_state:  # our earlier layout kept it in trainer_state.json
            ours = trainer_state
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: its {STATE} or {OURS} cannot be read: {exc}") from exc
    step = int(trainer_state["global_step"] if "global_step" in trainer_state else trainer_state["step"])
    state = {
        "step": step,
        "sampler_state": ours["sampler_state"] if ours else None,
        "extra": (ours or {}).get("extra", {}),
        "trainer_state": trainer_state,
    }
    if engine is not None:
        _load_engine(path, engine)
    if model is not None:
        _apply_model_state(model, model_state, os.path.join(path, model_name))
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    if scheduler is not None:
        scheduler.load_state_dict(scheduler_state)
    rng_name = next((n for n in _rng_files(rank) if os.path.isfile(os.path.join(path, n))), None)
    if rng_name is not None:
        # RNG states are CPU byte tensors whatever device the model lives on.
        rng = load(rng_name, "cpu")
        if restore_rng:
            set_rng_state(rng)
        else:
            state["rng"] = rng
    else:
        warnings.warn(
            f"{os.path.join(path, _rng_files(rank)[0])} is missing (resuming on more ranks than saved?): rank "
            f"{rank} keeps its current random state, so the run will not repeat the original one exactly"
        )
    return state
