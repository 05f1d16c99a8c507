"""DDP with gradient accumulation reduces gradients once per optimizer step (issue 23, item 7).

HF's Trainer (through accelerate) and optimum-habana's run every micro-batch but a step's last under
DDP's no_sync(), so the gradients are all-reduced in the last backward only. Two real gloo ranks, each
training twice from the same seed: with the Trainer as it is, and with DDP.no_sync made a no-op (every
backward all-reduces, as before). A DDP communication hook registered by the script counts the
all-reduces; the losses and weights of both runs must agree.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.runtime.test_trainer import two_rank_results

RANKS = textwrap.dedent("""
    import contextlib, json, os, sys
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    class Reg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin1, self.lin2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

        def forward(self, x, y):
            return {"loss": torch.nn.functional.mse_loss(self.lin2(torch.relu(self.lin1(x))).squeeze(-1), y)}

    g = torch.Generator().manual_seed(0)
    xs = torch.randn(96, 8, generator=g)
    ys = xs @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(96, generator=g)
    data = [{"x": xs[i], "y": ys[i]} for i in range(96)]
    real_no_sync = DistributedDataParallel.no_sync
    result = {"rank": os.environ["RANK"]}
    for mode in ("every_backward", "trainer"):
        # Before the fix the Trainer never entered no_sync: the same as no_sync doing nothing.
        DistributedDataParallel.no_sync = (lambda self: contextlib.nullcontext()) if mode == "every_backward" else real_no_sync
        args = TrainingArguments(output_dir=os.path.join(sys.argv[1], mode), per_device_train_batch_size=4,
                                 gradient_accumulation_steps=3, learning_rate=5e-2, max_steps=4, logging_steps=1,
                                 save_steps=0, device="cpu", seed=3, report_to="none")
        reduced, per_step = [], []  # bucket indices all-reduced; the count at each step's end

        def hook(state, bucket):
            reduced.append(bucket.index())
            return allreduce_hook(None, bucket)

        trainer = Trainer(Reg(), args, train_dataset=data, log=lambda s: None,
                          on_step_end=lambda step: per_step.append(len(reduced)))
        assert isinstance(trainer.train_model, DistributedDataParallel)
        trainer.train_model.register_comm_hook(None, hook)
        out = trainer.train()
        counts = [b - a for a, b in zip([0] + per_step, per_step)]
        rounds = [reduced[a:b].count(0) for a, b in zip([0] + per_step, per_step)]  # backwards that reduced
        losses = [json.loads(line).get("loss") for line in open(os.path.join(args.output_dir, "metrics.jsonl"))]
        result[mode] = {"counts": counts, "rounds": rounds, "train_loss": out.train_loss,
                        "losses": [x for x in losses if x is not None],
                        "params": [p.detach().reshape(-1).tolist() for p in trainer.model.parameters()]}
        del trainer
    print("RESULT " + json.dumps(result), flush=True)
""")


def test_ddp_all_reduces_once_per_optimizer_step_with_accumulation(tmp_path):
    results = two_rank_results(tmp_path, RANKS)
    assert len(results) == 2
    for r in results:
        before, now = r["every_backward"], r["trainer"]
        assert before["rounds"] == [3] * 4  # the reference run: every micro-batch's backward reduced
        assert now["rounds"] == [1] * 4  # the fix: the step's last backward only
        assert now["counts"] == [c // 3 for c in before["counts"]]  # all buckets, once
        # Reducing the sum of three local gradients once, or each of them: the same gradients up to
        # float32 rounding (the order of additions differs), so the same training.
        assert now["losses"] == before["losses"] and len(now["losses"]) == 4
        assert now["train_loss"] == pytest.approx(before["train_loss"], rel=1e-6)
        for a, b in zip(now["params"], before["params"]):
            assert a == pytest.approx(b, abs=1e-6)
    assert results[0]["trainer"]["params"] == results[1]["trainer"]["params"]  # the ranks agree
