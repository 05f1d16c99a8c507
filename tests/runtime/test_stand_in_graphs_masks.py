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


# ---- item 6: no host sync per micro-step with the shipped examples' data -------------------------


def _seed_workload(name: str):
    """(model, dataset, collator) as run_clm / run_mlm / run_summarization build them (tiny configs,
    the shipped corpus and tokenizer); the T5 set holds padded and unpadded sources."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    from gaudi_launch.runtime import data, mlm, summarization

    texts, tok = data.load_text_files(None, None), data.load_tokenizer(None)
    torch.manual_seed(0)
    if name == "t5":
        encoded = summarization.encode_pairs(summarization.fable_pairs(texts["train"]), tok, 128, 32)
        short = [e for e in encoded if len(e["input_ids"]) < 128][:2]
        full = [e for e in encoded if len(e["input_ids"]) == 128][:2]
        config = AutoConfig.from_pretrained(f"{data.ASSETS}/tiny-t5")
        collator = summarization.Seq2SeqCollator(tok.pad_token_id, 128, 32)  # --pad_to_max_length
        return AutoModelForSeq2SeqLM.from_config(config), summarization.ListDataset(short + full), collator
    blocks = data.tokenize_and_group(texts["validation"], tok, 32)[:4]
    if name == "mlm":
        mask_id = mlm.add_mask_token(tok)
        config = AutoConfig.from_pretrained(f"{data.ASSETS}/tiny-bert")
        config.vocab_size = len(tok)
        collator = mlm.MLMCollator(mask_id, len(tok), 0.15, [tok.pad_token_id, tok.eos_token_id])
        return AutoModelForMaskedLM.from_config(config), data.BlockDataset(blocks), collator
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(f"{data.ASSETS}/tiny-gpt2"))
    if name == "clm_hf_collator":  # transformers' run_clm: its blocks carry an all-ones mask, its collator sends it
        from transformers import default_data_collator

        ones = [{**b, "attention_mask": [1] * len(b["input_ids"])} for b in blocks]
        return model, summarization.ListDataset(ones), default_data_collator
    return model, data.BlockDataset(blocks), data.causal_lm_collator


@pytest.mark.parametrize("workload", ["clm", "mlm", "t5", "clm_hf_collator"])
def test_stand_in_item6_no_host_sync_per_micro_step_in_lazy_mode(hpu_stand_in, tmp_path, workload):
    # Before: an all-ones attention_mask from every collator, which transformers reads on the host in
    # every forward to see that it can drop it (T5: twice, for a padded source too).
    model, dataset, collator = _seed_workload(workload)
    args = TrainingArguments(
        device="hpu",
        use_lazy_mode=True,
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,  # T5: padded and unpadded sources in separate micro-steps
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=100,
        save_steps=0,
    )
    trainer = Trainer(model, args, train_dataset=dataset, data_collator=collator, log=lambda s: None)
    per_micro_step: list = []
    micro_step = trainer._micro_step

    def counted(*a, **k):
        start = len(hpu_stand_in)
        try:
            return micro_step(*a, **k)
        finally:
            per_micro_step.append([d for n, d in hpu_stand_in[start:] if n == "host_sync"])

    trainer._micro_step = counted
    trainer.train()
    assert len(per_micro_step) == 4
    # The first forward checks once for padding without a mask (transformers' one-time warning).
    assert len(per_micro_step[0]) <= 1 and per_micro_step[1:] == [[], [], []], per_micro_step


@pytest.mark.parametrize("workload", ["clm", "mlm", "t5"])
def test_item6_the_loss_is_the_same_without_the_all_ones_mask(workload):
    # What the collators leave out (or, for an encoder-decoder on HPU, expand on the host) changes nothing.
    from gaudi_launch.runtime.masks import expanded_encoder_mask

    model, dataset, collator = _seed_workload(workload)
    model.eval()
    batch = collator([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        plain = model(**batch).loss
        if workload == "t5":
            assert "attention_mask" in batch  # padded sources keep their mask
            expanded = {**batch, "attention_mask": expanded_encoder_mask(batch["attention_mask"], torch.float32)}
            torch.testing.assert_close(model(**expanded).loss, plain, rtol=1e-6, atol=0)
            unpadded = collator([dataset[i] for i in (2, 3)])
            assert "attention_mask" not in unpadded
            batch, plain = unpadded, model(**unpadded).loss
        else:
            assert "attention_mask" not in batch
        ones = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
        torch.testing.assert_close(model(**ones).loss, plain, rtol=1e-6, atol=0)


@pytest.mark.parametrize("workload,signatures", [("clm", 1), ("mlm", 1), ("t5", 2)])
def test_stand_in_item6_graph_captures_and_no_stale_branch_under_hpu_graphs(
    hpu_stand_in, tmp_path, workload, signatures
):
    # A graph per input signature: T5's padded sources (with a mask) and unpadded ones (without). No
    # replay would have read other values on the host than its capture did (a branch baked in).
    model, dataset, collator = _seed_workload(workload)
    args = TrainingArguments(
        device="hpu",
        use_lazy_mode=True,
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=100,
        save_steps=0,
        use_hpu_graphs_for_training=True,
        use_hpu_graphs_for_inference=True,
    )
    trainer = Trainer(
        model, args, train_dataset=dataset, eval_dataset=dataset, data_collator=collator, log=lambda s: None
    )
    trainer.train()
    trainer.evaluate()
    calls = names(hpu_stand_in)
    assert calls.count("ModuleCacher.capture") == signatures and calls.count("ModuleCacher.replay") == 4 - signatures
    assert calls.count("wrap_in_hpu_graph.capture") == signatures
    stale = [d for n, d in hpu_stand_in if n.endswith("stale_read")]
    # GPT-2's one-time padding check (runtime/masks.py) reads at its first forward only: nothing else.
    assert all(d["now"] == [] and len(d["captured"]) == 1 for d in stale), stale


def test_stand_in_item3_generation_after_an_evaluation_under_inference_graphs(hpu_stand_in, tmp_path):
    # evaluate() leaves the forward wrapped in HPU graphs; generating through them with a cache goes
    # wrong (a replay runs no Python, so the cache does not grow), so run_summarization's ROUGE
    # generates with the model's own forward.
    import copy
    import sys

    from gaudi_launch.runtime import data, summarization
    from tests.runtime.test_stand_in_hpu import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import run_summarization
    finally:
        sys.path.pop(0)
    texts, tok = data.load_text_files(None, None), data.load_tokenizer(None)
    pairs = summarization.fable_pairs(texts["validation"])[:1]
    encoded = summarization.encode_pairs(pairs, tok, 128, 8)
    collator = summarization.Seq2SeqCollator(tok.pad_token_id, 128, 8)
    scores = {}
    built = run_summarization.build_model(run_summarization.ModelArguments(), len(tok))
    for graphs in (False, True):
        model = copy.deepcopy(built)
        model.config.use_cache = True  # --use_cache: the decoder's keys and values kept between steps
        args = TrainingArguments(
            device="hpu",
            use_lazy_mode=True,
            output_dir=str(tmp_path / f"g{graphs}"),
            use_hpu_graphs_for_inference=graphs,
        )
        trainer = Trainer(
            model, args, eval_dataset=summarization.ListDataset(encoded), data_collator=collator, log=lambda s: None
        )
        trainer.evaluate()
        model.eval()
        batch = {k: v.to("hpu") for k, v in collator(encoded).items() if k != "labels"}
        with torch.no_grad():
            out = model.generate(
                **batch,
                min_new_tokens=5,
                max_new_tokens=5,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
        scores[graphs] = torch.stack([s.cpu() for s in out.scores])
    model.generation_config.min_new_tokens = 3  # an untrained model may end at once
    start = len(hpu_stand_in)
    run_summarization.generate_rouge(
        trainer,
        tok,
        pairs,
        encoded,
        collator,
        run_summarization.DataArguments(max_target_length=3),
        run_summarization.Seq2SeqArguments(predict_with_generate=True),
    )
    assert "wrap_in_hpu_graph.replay" not in names(hpu_stand_in[start:])
    # The stand-in catches it: through the graphs the scores after the first step are wrong.
    assert not torch.allclose(scores[True], scores[False])
    torch.testing.assert_close(scores[True][0], scores[False][0])
