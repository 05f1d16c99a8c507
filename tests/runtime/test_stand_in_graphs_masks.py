"""Evaluation under HPU graphs, attention masks and host syncs, against the habana_frameworks stand-in
(issue 23, items 3, 6 and 10). Single-process, tiny models: seconds each."""

from __future__ import annotations

import pytest
import torch

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.device import select_device
from gaudi_launch.runtime.trainer import Trainer
from tests.runtime.test_stand_in_hpu import _tiny_lm, _Tokens


def names(calls):
    return [name for name, _ in calls]


# ---- item 3: evaluation under --use_hpu_graphs_for_inference -------------------------------------


def test_stand_in_inference_graphs_return_static_outputs(hpu_stand_in):
    # The bridge's wrapped_hpugraph_forward returns cached.graph_outputs on every replay.
    select_device(TrainingArguments(device="hpu", use_lazy_mode=True))
    import habana_frameworks.torch.hpu as hpu

    model = hpu.wrap_in_hpu_graph(torch.nn.Linear(2, 1).to("hpu"))
    first = model(torch.ones(1, 2).to("hpu"))
    kept = first.clone()
    second = model(torch.zeros(1, 2).to("hpu"))
    assert second is first and not torch.equal(first, kept)  # the first result was overwritten
    model(torch.ones(3, 2).to("hpu"))  # a new shape: a graph of its own
    assert names(hpu_stand_in).count("wrap_in_hpu_graph.capture") == 2
    assert names(hpu_stand_in).count("wrap_in_hpu_graph.replay") == 1


def _eval_loss(tmp_path, graphs: bool, eval_metrics=None) -> dict:
    args = TrainingArguments(
        device="hpu",
        use_lazy_mode=True,
        output_dir=str(tmp_path / f"graphs{graphs}"),
        per_device_eval_batch_size=4,
        use_hpu_graphs_for_inference=graphs,
    )
    trainer = Trainer(_tiny_lm(), args, eval_dataset=_Tokens(), eval_metrics=eval_metrics, log=lambda s: None)
    return trainer.evaluate()


def test_stand_in_item3_eval_loss_the_same_with_and_without_inference_graphs(hpu_stand_in, tmp_path):
    # Before: evaluate() kept the first replay's loss tensor as its running total, which the next
    # replays overwrote: the eval loss came out biased under --use_hpu_graphs_for_inference.
    def loss_metric(out, batch):  # the output's own tensor, handed on as it is
        return {"loss_again": (out.loss, torch.ones((), device=out.loss.device))}

    plain = _eval_loss(tmp_path, False, loss_metric)
    start = len(hpu_stand_in)
    graphed = _eval_loss(tmp_path, True, loss_metric)
    calls = names(hpu_stand_in[start:])
    assert calls.count("wrap_in_hpu_graph.capture") == 1 and calls.count("wrap_in_hpu_graph.replay") == 7
    # The same batches through the same computation: equal up to float summation order.
    assert graphed["eval_loss"] == pytest.approx(plain["eval_loss"], rel=1e-6)
    assert graphed["loss_again"] == pytest.approx(plain["eval_loss"], rel=1e-6)
    assert plain["loss_again"] == pytest.approx(plain["eval_loss"], rel=1e-6)


# ---- item 10: FusedSDPA's masks --------------------------------------------------------------------


def test_stand_in_fused_sdpa_mask_semantics_are_the_bridge_reference(hpu_stand_in):
    # The bridge's test reference: a boolean mask keeps True, a float one is added.
    from habana_frameworks.torch.hpex.kernels import FusedSDPA

    from gaudi_launch.runtime.attention import additive_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8).to("hpu") for _ in range(3))
    keep = torch.tensor([True, True, False, True]).expand(2, 1, 4, 4).clone()
    by_bool = FusedSDPA.apply(q, k, v, keep.to("hpu"))
    by_float = FusedSDPA.apply(q, k, v, additive_mask(keep, torch.float32).to("hpu"))
    torch.testing.assert_close(by_bool.cpu(), by_float.cpu(), rtol=0, atol=1e-6)
    want = torch.nn.functional.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), attn_mask=keep)
    torch.testing.assert_close(by_float.cpu(), want, rtol=1e-5, atol=1e-6)
    # A query row that attends to nothing: NaN from the -inf fill, finite from the additive mask.
    keep[0, 0, 1] = False
    assert torch.isnan(FusedSDPA.apply(q, k, v, keep.to("hpu")).cpu()[0, :, 1]).all()
    assert torch.isfinite(FusedSDPA.apply(q, k, v, additive_mask(keep, torch.float32).to("hpu")).cpu()).all()
