"""Checkpoint save/load/rotation/atomicity, throughput accounting and metric logging."""

from __future__ import annotations

import datetime
import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gaudi_launch.runtime.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from gaudi_launch.runtime.metrics import MetricsWriter, Throughput, format_log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def train_steps(model, opt, sched, n: int) -> None:
    for _ in range(n):
        opt.zero_grad()
        x = torch.rand(5, 4)  # draws from the global RNG, so resumed runs depend on it being restored
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()


def ckpt_names(output_dir) -> list:
    return sorted(n for n in os.listdir(output_dir) if n.startswith("checkpoint-"))


def quick_save(output_dir, step, **kw):
    model, opt, sched = make(step)
    return save_checkpoint(
        str(output_dir), step, model=model, optimizer=opt, scheduler=sched, sampler_state={"epoch": 0}, **kw
    )


def test_round_trip_restores_everything_exactly(tmp_path):
    model, opt, sched = make(0)
    train_steps(model, opt, sched, 3)
    random.seed(7)
    np.random.seed(7)
    path = save_checkpoint(
        str(tmp_path),
        3,
        model=model,
        optimizer=opt,
        scheduler=sched,
        sampler_state={"epoch": 1, "index": 24},
        extra={"loss": 0.5},
    )
    assert path == str(tmp_path / "checkpoint-3")
    # transformers' Trainer layout (its file names; trainer_state.json with its TrainerState fields) and ours.
    assert sorted(os.listdir(path)) == [
        "gaudi_launch_state.json",
        "model.safetensors",
        "optimizer.pt",
        "rng_state.pth",
        "scheduler.pt",
        "trainer_state.json",
    ]
    # What the uninterrupted run sees next: random numbers, then the rest of training.
    expected_rand = (torch.rand(3), random.random(), np.random.rand())
    train_steps(model, opt, sched, 2)
    expected_params = [p.detach().clone() for p in model.parameters()]
    expected_lr = sched.get_last_lr()

    # A fresh process would start with other weights and other random states.
    model2, opt2, sched2 = make(99)
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    state = load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert {k: state[k] for k in ("step", "sampler_state", "extra")} == {
        "step": 3,
        "sampler_state": {"epoch": 1, "index": 24},
        "extra": {"loss": 0.5},
    }
    assert state["trainer_state"]["global_step"] == 3
    got_rand = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got_rand[0], expected_rand[0]) and got_rand[1:] == expected_rand[1:]
    train_steps(model2, opt2, sched2, 2)
    assert all(torch.equal(a, b) for a, b in zip(model2.parameters(), expected_params))
    assert sched2.get_last_lr() == expected_lr


def test_rotation_keeps_newest_total_limit(tmp_path):
    for step in (10, 20, 30, 40, 50):
        quick_save(tmp_path, step, total_limit=2)
    assert ckpt_names(tmp_path) == ["checkpoint-40", "checkpoint-50"]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-50")
    # Sorted by number, not by name: 100 is newer than 50.
    quick_save(tmp_path, 100, total_limit=2)
    assert ckpt_names(tmp_path) == ["checkpoint-100", "checkpoint-50"]
    # A rerun from an earlier step never deletes the checkpoint it has just written.
    quick_save(tmp_path, 60, total_limit=2)
    assert ckpt_names(tmp_path) == ["checkpoint-100", "checkpoint-60"]
    # Nothing but checkpoints is left behind (no temp or half-deleted directories).
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-100", "checkpoint-60"]
    with pytest.raises(ValueError):
        quick_save(tmp_path, 70, total_limit=0)


def test_saving_the_same_step_again_replaces_it(tmp_path):
    quick_save(tmp_path, 5)
    model, opt, sched = make(42)
    save_checkpoint(str(tmp_path), 5, model=model, optimizer=opt, scheduler=sched, sampler_state={"epoch": 9})
    assert os.listdir(tmp_path) == ["checkpoint-5"]
    state = load_checkpoint(str(tmp_path / "checkpoint-5"), model=make(0)[0])
    assert state["sampler_state"] == {"epoch": 9}


def test_failure_mid_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    quick_save(tmp_path, 1)
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        if getattr(f, "name", str(f)).endswith("optimizer.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint-2 failed writing .*optimizer.pt: disk full; the "
        r"previous checkpoint .*checkpoint-1 is kept",
    ):
        quick_save(tmp_path, 2)
    assert os.listdir(tmp_path) == ["checkpoint-1"]  # the temp directory is cleaned up too
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")


def test_hard_crash_mid_save_leaves_previous_checkpoint(tmp_path):
    """The process dies (no exception handling runs) after model.pt is written."""
    quick_save(tmp_path, 1)
    script = textwrap.dedent(
        f"""
        import os, torch
        from gaudi_launch.runtime.checkpoint import save_checkpoint
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            if f.name.endswith("optimizer.pt"):
                os._exit(17)
            return real_save(obj, f, *a, **k)
        torch.save = dying_save
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        save_checkpoint({str(tmp_path)!r}, 2, model=model, optimizer=opt, scheduler=None, sampler_state={{}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60)
    assert proc.returncode == 17
    leftovers = [n for n in os.listdir(tmp_path) if n != "checkpoint-1"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-checkpoint-2-")
    assert "model.safetensors" in os.listdir(tmp_path / leftovers[0])  # it really died mid-save
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")


def test_latest_checkpoint_edge_cases(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing")) is None
    assert latest_checkpoint(str(tmp_path)) is None
    quick_save(tmp_path, 3)
    (tmp_path / "checkpoint-9").mkdir()  # not ours / incomplete: no trainer_state.json
    (tmp_path / "checkpoint-7.bak").mkdir()
    (tmp_path / "checkpoint-8").write_text("a file")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-3")


def test_world_above_one_needs_a_process_group(tmp_path):
    with pytest.raises(RuntimeError, match="process group"):
        quick_save(tmp_path, 1, rank=0, world=2)


def _dist_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(rank)  # each rank's own random stream
    model = torch.nn.Linear(2, 2)
    path = save_checkpoint(
        out, 4, model=model, optimizer=None, scheduler=None, sampler_state={"rank0": True}, rank=rank, world=2
    )
    # Right after the call every rank sees the final directory with every rank's RNG file.
    seen = sorted(os.listdir(path))
    expected = torch.rand(4)
    torch.manual_seed(555)
    state = load_checkpoint(path, model=model, rank=rank)
    torch.save(
        {"path": path, "seen": seen, "restored": torch.equal(torch.rand(4), expected), "state": state},
        os.path.join(out, f"result-{rank}.pt"),
    )
    dist.destroy_process_group()


def test_two_ranks_save_one_checkpoint(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # for the spawned ranks only: left in this process it would reach later tests' multi-host jobs
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    ctx = mp.start_processes(_dist_rank, args=(port, str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 60
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "ranks did not finish"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    for rank in range(2):
        res = torch.load(tmp_path / f"result-{rank}.pt", weights_only=True)
        assert res["path"] == str(tmp_path / "checkpoint-4")
        assert res["seen"] == [
            "gaudi_launch_state.json",
            "model.safetensors",
            "rng_state_0.pth",
            "rng_state_1.pth",
            "trainer_state.json",
        ]
        assert res["restored"] and res["state"]["sampler_state"] == {"rank0": True}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(warmup: int):
    clock = FakeClock()
    tp = Throughput(warmup_steps=warmup, clock=clock)
    clock.now = 10.0  # the first step compiles graphs: 10 s
    tp.step(samples=4, tokens=400)
    for _ in range(4):  # then 0.5 s per step
        clock.now += 0.5
        tp.step(samples=4, tokens=400)
    return tp.metrics()


def test_throughput_excludes_warmup_steps():
    m = run_steps(warmup=1)
    assert m["measured_steps"] == 4
    assert m["train_samples_per_second"] == pytest.approx(16 / 2.0)
    assert m["train_tokens_per_second"] == pytest.approx(1600 / 2.0)
    assert m["train_steps_per_second"] == pytest.approx(4 / 2.0)
    assert m["train_runtime"] == pytest.approx(12.0)  # the whole run, warm-up included


def test_throughput_without_warmup_includes_first_step():
    m = run_steps(warmup=0)
    assert m["measured_steps"] == 5
    assert m["train_samples_per_second"] == pytest.approx(20 / 12.0)
    assert m["train_steps_per_second"] == pytest.approx(5 / 12.0)


def test_throughput_zeros_without_measured_steps():
    clock = FakeClock()
    tp = Throughput(warmup_steps=3, clock=clock)
    assert tp.metrics() == {
        "train_samples_per_second": 0.0,
        "train_tokens_per_second": 0.0,
        "train_steps_per_second": 0.0,
        "train_runtime": 0.0,
        "measured_steps": 0,
        "measured_samples": 0,
    }
    clock.now = 5.0
    tp.step(8)
    m = tp.metrics()
    assert m["measured_steps"] == 0 and m["train_samples_per_second"] == 0.0


def test_throughput_leaves_paused_time_out_of_the_rates():
    clock = FakeClock()
    tp = Throughput(warmup_steps=1, clock=clock)
    clock.now = 10.0
    tp.step(4)  # warm-up
    with tp.pause():  # an evaluation during warm-up: the window restarts after it anyway
        clock.now += 7.0
    for _ in range(4):
        clock.now += 0.5
        tp.step(4)
        with tp.pause():  # an evaluation after every step, the last one included
            clock.now += 3.0
    m = tp.metrics()
    assert m["train_samples_per_second"] == pytest.approx(16 / 2.0)
    assert m["train_steps_per_second"] == pytest.approx(4 / 2.0)


def test_metrics_writer_rank0_json_lines(tmp_path):
    w = MetricsWriter(str(tmp_path), rank=0)
    w.log(1, {"loss": torch.tensor(2.5), "lr": 1e-4, "grad_norm": float("nan"), "epoch": np.int64(0)})
    w.log(2, {"loss": 2.25, "note": "ok"})
    w.close()
    w.close()  # idempotent
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}")) for line in lines]
    assert records == [
        {"step": 1, "loss": 2.5, "lr": 1e-4, "grad_norm": "nan", "epoch": 0},
        {"step": 2, "loss": 2.25, "note": "ok"},
    ]
    # A resumed run appends.
    with MetricsWriter(str(tmp_path), rank=0) as w:
        w.log(3, {"loss": 2.0})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_metrics_writer_other_ranks_write_nothing(tmp_path):
    out = tmp_path / "out"
    w = MetricsWriter(str(out), rank=1)
    w.log(1, {"loss": 1.0})
    w.close()
    assert not out.exists()


def test_metrics_writer_tensorboard_scalars(tmp_path, monkeypatch):
    scalars = []

    class FakeSummaryWriter:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, global_step):
            scalars.append((tag, value, global_step))

        def close(self):
            scalars.append("closed")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeSummaryWriter))
    w = MetricsWriter(str(tmp_path), rank=0)
    w.log(7, {"loss": 1.5, "note": "text", "flag": True})
    w.close()
    assert scalars == [("loss", 1.5, 7), "closed"]
    # tensorboard=False never touches it.
    scalars.clear()
    MetricsWriter(str(tmp_path), rank=0, tensorboard=False).close()
    assert scalars == []


def test_metrics_writer_without_tensorboard_is_silent(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with MetricsWriter(str(tmp_path), rank=0) as w:
        w.log(1, {"loss": 1.0})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "loss": 1.0}


def test_format_log():
    line = format_log(
        10,
        {"loss": 2.34567, "lr": 1e-4, "train_samples_per_second": 1234.5, "epoch": 1, "grad_norm": torch.tensor(0.5)},
    )
    assert line == "step 10 | loss 2.346 | lr 0.0001 | train_samples_per_second 1234.5 | epoch 1 | grad_norm 0.5"
    assert format_log(3, {}) == "step 3"


def _truncate(path, keep: int = 100) -> None:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:keep])


def test_a_truncated_checkpoint_is_an_error_naming_the_file_and_nothing_is_applied(tmp_path):
    quick_save(tmp_path, 1)
    _truncate(tmp_path / "checkpoint-1" / "optimizer.pt")
    model, opt, sched = make(7)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match=r"checkpoint-1/optimizer.pt cannot be loaded"):
        load_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt, scheduler=sched)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # model.pt was fine, yet unapplied


def test_resuming_latest_falls_back_past_a_truncated_newest_checkpoint(tmp_path):
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    data = [{"x": torch.randn(4), "y": torch.randn(2)} for _ in range(32)]

    class Reg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x, y):
            return {"loss": torch.nn.functional.mse_loss(self.lin(x), y)}

    def trainer(max_steps, resume=None):
        args = TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=max_steps,
            save_steps=2,
            logging_steps=1,
            per_device_train_batch_size=4,
            device="cpu",
            resume_from_checkpoint=resume,
        )
        torch.manual_seed(0)
        return Trainer(Reg(), args, train_dataset=data, log=lambda s: None)

    trainer(4).train()
    assert latest_checkpoint(str(tmp_path)).endswith("checkpoint-4")
    _truncate(tmp_path / "checkpoint-4" / "model.safetensors")
    again = trainer(6, resume="latest")
    with pytest.warns(
        UserWarning,
        match=r"checkpoint-4/model.safetensors cannot be loaded.*resuming from the previous "
        r"checkpoint .*checkpoint-2 instead",
    ):
        out = again.train()
    assert out.global_step == 6
    _truncate(tmp_path / "checkpoint-4" / "model.safetensors")  # the resumed run saved step 4 anew
    with pytest.raises(CheckpointError, match="checkpoint-4/model.safetensors cannot be loaded"):
        trainer(6, resume=str(tmp_path / "checkpoint-4")).train()  # a path given: that one, or an error


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="mounting a tmpfs needs root")
def test_disk_full_during_save_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)], check=True)
    try:
        quick_save(disk, 1)  # small enough to fit
        model = torch.nn.Linear(256, 256)  # 256 KiB of weights: does not
        with pytest.raises(
            CheckpointError,
            match=r"checkpoint-2 failed writing .*model.safetensors: No space left on device; "
            r"the previous checkpoint .*checkpoint-1 is kept",
        ):
            save_checkpoint(str(disk), 2, model=model, optimizer=None, scheduler=None, sampler_state={})
        assert sorted(os.listdir(disk)) == ["checkpoint-1"]
        load_checkpoint(str(disk / "checkpoint-1"), model=make(0)[0])
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_deepspeed_checkpoint_counts_as_complete_and_asks_for_deepspeed_to_resume(tmp_path):
    # Under --deepspeed, checkpoint-N holds the engine's deepspeed/ directory instead of the model file.
    path = tmp_path / "checkpoint-3"
    (path / "deepspeed").mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": 3, "sampler_state": {}, "extra": {}}))
    assert latest_checkpoint(str(tmp_path)) == str(path)
    with pytest.raises(CheckpointError, match="holds a DeepSpeed checkpoint .*resume it with --deepspeed"):
        load_checkpoint(str(path), model=torch.nn.Linear(2, 2))
    (tmp_path / "checkpoint-4").mkdir()  # neither a model file nor deepspeed/: not a checkpoint
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert latest_checkpoint(str(tmp_path)) == str(path)
