"""FastDDP on real gloo ranks, checked against torch DDP and a single-process reference.

One 2-rank job runs every distributed scenario (starting processes and importing torch is most of
the cost) and writes its results to files; the tests below assert on them.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gaudi_launch.runtime import fast_ddp
from gaudi_launch.runtime.fast_ddp import FastDDP

WORLD = 2
BATCH = 8  # per rank
STEPS = 5


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )
        # A buffer used in forward, to check that broadcast_parameters covers buffers too.
        self.register_buffer("shift", torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x + self.shift)


def make_model(seed: int) -> MLP:
    torch.manual_seed(seed)
    model = MLP()
    model.shift.normal_()
    return model


def batch(rank: int, step: int = 0):
    """Each rank's own data, reproducible anywhere (so every process can build the full batch)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def full_batch(step: int = 0):
    xs, ys = zip(*(batch(r, step) for r in range(WORLD)))
    return torch.cat(xs), torch.cat(ys)


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def train(model, opt_cls, rank, reduce, set_to_none=False):
    opt = opt_cls(model.parameters(), lr=0.05)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        x, y = batch(rank, step) if rank is not None else full_batch(step)
        loss_fn(model, x, y).backward()
        reduce()
        opt.step()
    return params(model)


def rank_main(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    res = {}
    x, y = batch(rank)

    # Gradients: FastDDP (fp32 buffer) vs torch DDP vs one process on the concatenated batch.
    model = make_model(0)
    ddp_model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    loss_fn(model, x, y).backward()
    reducer = FastDDP(model)
    reducer.all_reduce_gradients()
    res["fast_fp32"] = grads(model)
    # On CPU with an fp32 buffer the gradients are now views of the buffer, which is all of them.
    flat = reducer.flat_gradients()
    res["flat_is_buffer"] = flat is not None and flat.data_ptr() == reducer._buffer.data_ptr()
    res["grads_in_buffer"] = [
        p.grad.untyped_storage().data_ptr() == reducer._buffer.untyped_storage().data_ptr() for p in model.parameters()
    ]
    loss_fn(ddp_model, x, y).backward()
    res["ddp"] = grads(ddp_model.module)

    bf16_model = make_model(0)
    loss_fn(bf16_model, x, y).backward()
    res["local"] = grads(bf16_model)  # this rank's own gradient, before any reduction
    bf16_reducer = FastDDP(bf16_model, buffer_dtype=torch.bfloat16)
    bf16_reducer.all_reduce_gradients()
    res["fast_bf16"] = grads(bf16_model)
    res["bf16_flat"] = bf16_reducer.flat_gradients() is not None  # fp32 grads cannot be bf16 views

    # Exactly one all_reduce per step, counted at torch.distributed.all_reduce itself.
    calls = []
    real_all_reduce = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        counted = make_model(0)
        per_step = []
        for step in range(3):
            counted.zero_grad(set_to_none=False)
            loss_fn(counted, *batch(rank, step)).backward()
            before = len(calls)
            fast_ddp.all_reduce_gradients(counted, fusion_buffer_dtype=torch.float32)
            per_step.append(len(calls) - before)
        res["calls_per_step"] = per_step
        res["buffer_numel"] = calls[0]
        res["cached_once"] = (
            len(fast_ddp._INSTANCES) == 1 and fast_ddp._INSTANCES[counted].buffer_dtype == torch.float32
        )
    finally:
        dist.all_reduce = real_all_reduce

    # broadcast_parameters: differently initialised ranks end up with rank 0's model.
    diverse = make_model(100 + rank)
    res["before_broadcast"] = params(diverse) + [diverse.shift.clone()]
    FastDDP(diverse).broadcast_parameters()
    res["after_broadcast"] = params(diverse) + [diverse.shift.clone()]

    # Training: start from different inits, broadcast, then STEPS steps of SGD and of AdamW.
    for name, opt_cls in (("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)):
        m = make_model(200 + rank)
        reducer = FastDDP(m)
        reducer.broadcast_parameters()
        res[f"train_{name}"] = train(m, opt_cls, rank, reducer.all_reduce_gradients)
    # Gradients freed every step (set_to_none): each new one goes back into the buffer, same result.
    m = make_model(200 + rank)
    reducer = FastDDP(m)
    reducer.broadcast_parameters()
    res["train_set_to_none"] = train(m, torch.optim.AdamW, rank, reducer.all_reduce_gradients, set_to_none=True)

    # A gradient present at the first call and None later is an error, raised before the
    # collective on both ranks (so neither hangs).
    m = make_model(0)
    reducer = FastDDP(m)
    loss_fn(m, x, y).backward()
    reducer.all_reduce_gradients()
    m.net[2].weight.grad = None
    try:
        reducer.all_reduce_gradients()
        res["none_error"] = None
    except RuntimeError as e:
        res["none_error"] = str(e)

    # A group of one rank: nothing to reduce, no collective issued, gradients untouched.
    own = [dist.new_group([r]) for r in range(WORLD)][rank]
    m = make_model(0)
    loss_fn(m, x, y).backward()
    before = grads(m)
    calls.clear()
    dist.all_reduce = counting
    try:
        FastDDP(m, group=own).all_reduce_gradients()
    finally:
        dist.all_reduce = real_all_reduce
    res["group1_calls"] = len(calls)
    res["group1_same"] = all(torch.equal(a, b) for a, b in zip(before, grads(m)))

    dist.barrier()
    torch.save(res, os.path.join(out_dir, f"rank-{rank}.pt"))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fast_ddp")
    # Inherited by the ranks (loopback only), and undone at once: left in this process it would reach
    # later tests' multi-host jobs (a Slurm job exports the whole environment).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        ctx = mp.start_processes(
            rank_main, args=(free_port(), str(out)), nprocs=WORLD, join=False, start_method="spawn"
        )
    deadline = time.monotonic() + 90
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError("gloo ranks did not finish within 90 s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in range(WORLD)]


def reference_grads():
    model = make_model(0)
    loss_fn(model, *full_batch()).backward()
    return grads(model)


def assert_close_all(a, b, atol, rtol=0.0):
    assert len(a) == len(b)
    for t, u in zip(a, b):
        torch.testing.assert_close(t, u, atol=atol, rtol=rtol)


def test_fp32_gradients_equal_ddp_and_single_process(results):
    ref = reference_grads()
    for res in results:
        assert_close_all(res["fast_fp32"], res["ddp"], atol=1e-6)
        assert_close_all(res["fast_fp32"], ref, atol=1e-6)
    # The ranks really had different local gradients, so the reduction did something.
    assert not torch.allclose(results[0]["local"][0], results[1]["local"][0])


def test_bf16_buffer_is_close(results):
    ref = reference_grads()
    for res in results:
        # bf16 keeps 8 bits of mantissa: relative error about 2**-8 per value, twice rounded.
        assert_close_all(res["fast_bf16"], ref, atol=1e-3, rtol=2e-2)
        assert all(t.dtype == torch.float32 for t in res["fast_bf16"])  # cast back to the grad dtype
    assert all(torch.equal(a, b) for a, b in zip(results[0]["fast_bf16"], results[1]["fast_bf16"]))


def test_training_keeps_ranks_identical_and_matches_reference(results):
    for name, opt_cls in (("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)):
        r0, r1 = results[0][f"train_{name}"], results[1][f"train_{name}"]
        assert all(torch.equal(a, b) for a, b in zip(r0, r1)), name
        # Same as one process training rank 0's initial model on the concatenated batches.
        reference = train(make_model(200), opt_cls, None, lambda: None)
        assert_close_all(r0, reference, atol=1e-5)


def test_gradients_are_views_of_the_buffer_on_cpu(results):
    for res in results:
        assert res["flat_is_buffer"] and all(res["grads_in_buffer"])
        assert not res["bf16_flat"]


def test_gradients_replaced_each_step_are_reduced_too(results):
    r0, r1 = results[0]["train_set_to_none"], results[1]["train_set_to_none"]
    assert all(torch.equal(a, b) for a, b in zip(r0, r1))
    assert_close_all(r0, train(make_model(200), torch.optim.AdamW, None, lambda: None), atol=1e-5)


def test_broadcast_parameters_makes_models_equal(results):
    b0, b1 = results[0]["before_broadcast"], results[1]["before_broadcast"]
    assert not torch.equal(b0[0], b1[0]) and not torch.equal(b0[-1], b1[-1])
    for res in results:
        # Parameters and the buffer now equal rank 0's originals.
        assert all(torch.equal(a, b) for a, b in zip(res["after_broadcast"], b0))


def test_one_all_reduce_per_step_with_cached_buffer(results):
    n_params = sum(p.numel() for p in make_model(0).parameters())
    for res in results:
        assert res["calls_per_step"] == [1, 1, 1]
        assert res["buffer_numel"] == n_params  # one flat buffer, no buckets
        assert res["cached_once"]


def test_grad_turning_none_raises(results):
    for res in results:
        msg = res["none_error"]
        assert msg is not None and "net.2.weight" in msg and "set_to_none=False" in msg


def test_group_of_one_is_a_no_op(results):
    for res in results:
        assert res["group1_calls"] == 0 and res["group1_same"]


def test_no_process_group_is_a_no_op(monkeypatch):
    assert not dist.is_initialized()

    def forbidden(*args, **kwargs):
        raise AssertionError("all_reduce must not be called without a process group")

    monkeypatch.setattr(dist, "all_reduce", forbidden)
    monkeypatch.setattr(dist, "broadcast", forbidden)
    model = make_model(0)
    loss_fn(model, *batch(0)).backward()
    before = grads(model)
    ddp = FastDDP(model)
    ddp.broadcast_parameters()
    ddp.all_reduce_gradients()
    fast_ddp.all_reduce_gradients(model)
    assert all(torch.equal(a, b) for a, b in zip(before, grads(model)))


def test_cache_does_not_keep_models_alive():
    import gc
    import weakref

    model = make_model(0)
    loss_fn(model, *batch(0)).backward()
    fast_ddp.all_reduce_gradients(model)
    assert model in fast_ddp._INSTANCES
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
