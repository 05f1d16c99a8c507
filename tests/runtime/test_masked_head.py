"""BERT's masked-LM head on the masked positions only (--mlm_head_masked_only): the same training
signal as transformers' own forward, the model's own forward wherever it must stay."""

from __future__ import annotations

import os

import pytest
import torch

from gaudi_launch.runtime.device import DeviceInfo
from gaudi_launch.runtime.masked_head import applies, use_masked_only_head
from gaudi_launch.runtime.mlm import mask_tokens

transformers = pytest.importorskip("transformers")

CPU = DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0)
HPU = DeviceInfo("hpu", torch.device("cpu"), "hccl", True, 0)  # kind is all use_masked_only_head reads
CUDA = DeviceInfo("cuda", torch.device("cpu"), "nccl", False, 0)
ASSETS = os.path.join(os.path.dirname(__file__), "..", "..", "gaudi_launch", "runtime", "assets")


def tiny_bert() -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-bert"))
    torch.manual_seed(0)
    return transformers.AutoModelForMaskedLM.from_config(config)


def batch(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1025, (4, 32), generator=g)
    inputs, labels = mask_tokens(ids, 3, 1025, 0.15, (0,), generator=g)
    return {"input_ids": inputs, "labels": labels, "attention_mask": torch.ones_like(ids)}


def test_the_same_loss_and_gradients_from_a_fraction_of_the_logits():
    model, sparse = tiny_bert(), tiny_bert()
    assert use_masked_only_head(sparse, CPU)
    b = batch()
    a, s = model(**b), sparse(**b)
    scored = b["labels"] != -100
    assert 0 < int(scored.sum()) < scored.numel() // 4  # a real mask: ~15% scored
    assert s.logits.shape == (int(scored.sum()), 1025)  # only the scored positions' rows
    torch.testing.assert_close(s.logits, a.logits[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.loss, a.loss, atol=1e-6, rtol=1e-6)
    a.loss.backward()
    s.loss.backward()
    for (name, p), q in zip(model.named_parameters(), sparse.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_evaluation_and_unlabelled_calls_get_every_positions_logits():
    model, sparse = tiny_bert(), tiny_bert()
    use_masked_only_head(sparse, CPU)
    b = batch()
    model.eval()
    sparse.eval()
    with torch.no_grad():
        a, s = model(**b), sparse(**b)
    assert s.logits.shape == (4, 32, 1025)
    torch.testing.assert_close(s.logits, a.logits)
    torch.testing.assert_close(s.loss, a.loss)
    sparse.train()
    unlabelled = {k: v for k, v in b.items() if k != "labels"}
    assert sparse(**unlabelled).logits.shape == (4, 32, 1025)
    assert sparse(**b, return_dict=False).loss is not None  # a caller's return_dict does not clash
    # positional arguments (input_ids, attention_mask, ...) take the model's own forward
    assert sparse(b["input_ids"], b["attention_mask"]).logits.shape == (4, 32, 1025)


def test_saved_model_is_the_models_own(tmp_path):
    sparse = tiny_bert()
    use_masked_only_head(sparse, CPU)
    sparse.save_pretrained(tmp_path)
    again = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert type(again) is transformers.BertForMaskedLM
    assert again.config.architectures == ["BertForMaskedLM"]
    assert again.state_dict().keys() == tiny_bert().state_dict().keys()


def test_hpu_cuda_graphs_opt_out_and_other_models_keep_their_own_forward():
    for info, enabled, graphs in ((HPU, True, False), (CPU, False, False), (CUDA, True, True)):
        model = tiny_bert()
        assert not use_masked_only_head(model, info, enabled, graphs)
        assert "forward" not in vars(model)
    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-gpt2"))
    gpt2 = transformers.AutoModelForCausalLM.from_config(config)
    assert not use_masked_only_head(gpt2, CPU)
    assert "forward" not in vars(gpt2)


def test_applies_off_hpu_and_without_cuda_graphs():
    assert applies("cpu", True, False) and applies("cuda", True, False) and applies("cpu", True, True)
    assert not applies("hpu", True, False) and not applies("cuda", True, True) and not applies("cpu", False, False)


def test_the_trainer_trains_and_evaluates_the_same_either_way(tmp_path):
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.mlm import MLMCollator, masked_accuracy, premask
    from gaudi_launch.runtime.trainer import Trainer

    g = torch.Generator().manual_seed(0)
    blocks = [{"input_ids": torch.randint(5, 1025, (32,), generator=g)} for _ in range(64)]
    held_out = premask([{"input_ids": b["input_ids"].tolist()} for b in blocks[:16]], 3, 1025, 0.15, (0,))
    runs = {}
    for masked_only in (True, False):
        out = tmp_path / str(masked_only)
        targs = TrainingArguments(
            output_dir=str(out),
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            max_steps=6,
            logging_steps=1,
            save_steps=0,
            device="cpu",
            seed=3,
            mlm_head_masked_only=masked_only,
        )
        trainer = Trainer(
            tiny_bert(),
            targs,
            train_dataset=blocks,
            eval_dataset=held_out,
            data_collator=MLMCollator(3, 1025, 0.15, (0,)),
            eval_metrics=masked_accuracy,
            log=lambda s: None,
        )
        assert ("forward" in vars(trainer.model)) is masked_only
        result = trainer.train()
        runs[masked_only] = (result.train_loss, trainer.evaluate())
    (loss, metrics), (full_loss, full_metrics) = runs[True], runs[False]
    assert loss == pytest.approx(full_loss, rel=1e-5)
    assert metrics["eval_loss"] == pytest.approx(full_metrics["eval_loss"], rel=1e-5)
    assert metrics["accuracy"] == full_metrics["accuracy"]
