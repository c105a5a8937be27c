"""The lean loss in ``HFLightningModule``: the plain path's loss and gradients without ever holding the
(tokens x vocab) logits.

``HFLightningModule.compute_loss`` with the lean loss is checked against the same module with
``lean_loss=False`` on real tiny models (untied Llama, GPT-2 with its tied head, Gemma-2's soft-capping,
Cohere's and Granite's logit scaling), loss and every parameter's gradient, relative 1e-6 in float32. The
chunked function itself is checked in ``test_linear_cross_entropy.py``; full optimizer steps under
accumulation and 2 DDP ranks are in ``tests/parity/test_lean_loss.py``.
"""

from __future__ import annotations

import copy
import inspect
import logging

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hf_lightning import HFLightningModule
from hf_lightning.core.batch import MICRO_ITEMS_KEY
from hf_lightning.module.lean_loss import LEAN_MIN_VOCAB, pays, strategy_reason
from hf_lightning.module.linear_cross_entropy import LogitTransform
from tests.data_support import tiny_llama
from tests.parity.lean_cases import ARCHS, TRANSFORMS, make_arch_model
from tests.parity.tiny_llama_case import VOCAB, _pad, make_rows
from tests.unit.hand_case import TableLM
from tests.unit.lean_loss_support import TOL, rel


# ------------------------------------------------------------------------------ HFLightningModule
def _batch(n_rows=4, with_count=True):
    ids, mask, labels = _pad(make_rows()[:n_rows])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    count = int((labels[:, 1:] != -100).sum())
    if with_count:
        batch[MICRO_ITEMS_KEY] = count
    return batch, count


def _loss_and_grads(module, batch, count):
    loss, outputs = module.compute_loss(batch, count)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
    return loss.detach(), outputs, grads


def _pair(arch, **kwargs):
    model = make_arch_model(arch)
    lean = HFLightningModule(model, lean_loss=True, **kwargs)  # a small vocabulary: auto takes the logits
    lean.lean.chunk_size = 5  # several chunks per micro-batch
    plain = HFLightningModule(copy.deepcopy(model), lean_loss=False, **kwargs)
    return lean, plain


@pytest.mark.parametrize("arch,eps", [(arch, 0.0) for arch in ARCHS] + [("llama", 0.1), ("gemma2", 0.1)])
def test_lean_loss_and_every_gradient_equal_the_plain_path(arch, eps):
    lean, plain = _pair(arch, label_smoothing_factor=eps)
    assert lean.lean.active, lean.lean.reason
    batch, count = _batch()
    loss, outputs, grads = _loss_and_grads(
        lean, batch, count + 3
    )  # a window count larger than this micro-batch's
    ref_loss, ref_outputs, ref_grads = _loss_and_grads(plain, batch, count + 3)
    assert outputs.logits is None and ref_outputs.logits.shape == (*batch["labels"].shape, VOCAB)  # lean ran
    assert rel(loss, ref_loss) <= TOL
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(lean.model.parameters()))
    for name in ref_grads:
        assert rel(grads[name], ref_grads[name]) <= TOL, name


@pytest.mark.parametrize("precision", ["bf16 autocast", "bf16 weights"])
def test_16_bit_runs_agree_within_bf16_rounding(precision):
    """The dtype paths (logits in bf16, upcast per chunk; bf16 gradients of the head) against the plain
    path."""
    model = make_arch_model("gemma2")
    if precision == "bf16 weights":
        model = model.to(torch.bfloat16)
    lean = HFLightningModule(model, lean_loss=True)
    lean.lean.chunk_size = 5
    plain = HFLightningModule(copy.deepcopy(model), lean_loss=False)
    batch, count = _batch()
    results = []
    for module in (lean, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16 autocast"):
            loss, _ = module.compute_loss(batch, count)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.float() for n, p in module.model.named_parameters()}))
    assert lean.lean.active and results[0][0].dtype == torch.float32
    assert float(results[0][0]) == pytest.approx(float(results[1][0]), rel=1e-3)
    for name, grad in results[1][1].items():
        assert rel(results[0][1][name], grad) < 3e-2, name


def test_the_tied_head_gets_the_gradient_of_both_uses():
    lean, plain = _pair("gpt2")
    model = lean.model
    assert model.lm_head.weight is model.transformer.wte.weight
    batch, count = _batch()
    _, _, grads = _loss_and_grads(lean, batch, count)
    _, _, ref = _loss_and_grads(plain, batch, count)
    assert rel(grads["transformer.wte.weight"], ref["transformer.wte.weight"]) <= TOL
    # the control: the head's share of that gradient (computed here from the final hidden states) is large, so
    # a lean path that dropped it, or counted only it, would fail the line above
    with torch.no_grad():
        hidden = plain.model.transformer(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        )[0]
    w = plain.model.lm_head.weight.detach().clone().requires_grad_()
    targets = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    (F.cross_entropy((hidden @ w.T).flatten(0, 1), targets.flatten(), reduction="sum") / count).backward()
    total = ref["transformer.wte.weight"]
    assert rel(total - w.grad, total) > 1e-2 and rel(w.grad, total) > 1e-2


@pytest.mark.parametrize("arch", sorted(TRANSFORMS))
def test_each_logit_transform_matters(arch):
    """The control for the transform cases: without the model's transform the loss would be visibly
    different."""
    lean, plain = _pair(arch)
    key, value = TRANSFORMS[arch]
    assert getattr(lean.model.config, key) == value and lean.lean.transform != LogitTransform()
    batch, count = _batch()
    ref_loss, _, _ = _loss_and_grads(plain, batch, count)
    lean.lean.transform = LogitTransform()
    lean.lean._checked = (
        True  # skip the first batch's check, which would catch the missing transform and fall back
    )
    wrong, _, _ = _loss_and_grads(lean, batch, count)
    assert abs(float(wrong) - float(ref_loss)) > 1e-2 * float(ref_loss)


@pytest.mark.parametrize("arch", sorted(TRANSFORMS))
def test_the_first_batch_check_catches_a_missing_transform(arch):
    lean, plain = _pair(arch)
    lean.lean.transform = LogitTransform()  # as if the family were unknown
    batch, count = _batch()
    loss, outputs, _ = _loss_and_grads(lean, batch, count)
    ref_loss, _, _ = _loss_and_grads(plain, batch, count)
    assert not lean.lean.active and "differ from lm_head(hidden)" in lean.lean.reason
    assert outputs.logits is not None and rel(loss, ref_loss) <= TOL


def test_without_the_window_count_every_position_goes_through_the_head():
    lean, plain = _pair("llama")
    batch, count = _batch(with_count=False)
    loss, _, grads = _loss_and_grads(lean, batch, None)
    ref_loss, _, ref_grads = _loss_and_grads(plain, batch, None)
    assert rel(loss, ref_loss) <= TOL
    assert all(rel(grads[n], ref_grads[n]) <= TOL for n in ref_grads)


def test_a_micro_batch_without_targets_adds_zero_and_touches_every_parameter():
    lean, _ = _pair("llama")
    batch, _ = _batch()
    batch["labels"] = torch.full_like(batch["labels"], -100)
    batch[MICRO_ITEMS_KEY] = 0
    loss, _, grads = _loss_and_grads(lean, batch, 5)  # the window's other micro-batches hold the targets
    assert float(loss) == 0.0
    # every parameter is in the graph (DDP needs that) and gets an exact zero
    assert len(grads) == len(list(lean.model.parameters())) and all(not g.any() for g in grads.values())


def test_the_lean_line_is_logged_once(caplog):
    lean, _ = _pair("gemma2")
    with caplog.at_level(logging.INFO, logger="hf_lightning.module.lean_loss"):
        lean._say_lean()
        lean._say_lean()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "lean loss: on" in lines[0] and "softcap 4" in lines[0]


# ------------------------------------------------------------------------------ falling back
class ScaledLogits(torch.nn.Module):
    """A causal LM whose forward doubles its head's logits (a transform no config key announces)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_arch_model("llama")
        self.config = self.inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out["logits"] = out.logits * 2.0
        return out


def test_a_model_whose_logits_differ_from_its_head_falls_back_on_its_first_batch(caplog):
    model = ScaledLogits()
    module = HFLightningModule(model, lean_loss=True)
    assert module.lean.active  # nothing in the config says so: the first batch's check finds it
    plain = HFLightningModule(copy.deepcopy(model), lean_loss=False)
    batch, count = _batch()
    with caplog.at_level(logging.INFO, logger="hf_lightning.module.lean_loss"):
        loss, outputs, _ = _loss_and_grads(module, batch, count)
    ref, _, _ = _loss_and_grads(plain, batch, count)
    assert not module.lean.active and "differ from lm_head(hidden)" in module.lean.reason
    assert outputs.logits is not None and rel(loss, ref) <= TOL
    assert any("the loss is computed from the full logits" in r.getMessage() for r in caplog.records)


def test_an_unknown_logit_cap_in_the_config_falls_back():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        logits_soft_cap=30.0,
    )
    module = HFLightningModule(LlamaForCausalLM(config), lean_loss=True)
    assert not module.lean.active and "logits_soft_cap=30.0" in module.lean.reason


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"lean_loss": False}, "module.lean_loss=false"),
        (
            {"compute_loss_func": lambda outputs, labels, num_items_in_batch: outputs.logits.sum()},
            "module.compute_loss_func computes the loss from the model's logits",
        ),
        ({"use_model_loss": True}, "the model's own loss computes the loss"),
        ({"causal": False}, "neither a causal LM nor an encoder-decoder LM"),
    ],
)
def test_arguments_that_need_the_logits_turn_it_off(kwargs, reason):
    module = HFLightningModule(make_arch_model("llama"), **kwargs)
    assert not module.lean.active and reason in module.lean.reason
    assert module.lean.describe().startswith("the loss is computed from the full logits: ")


@pytest.mark.parametrize(
    ("vocab", "lean_loss", "active"),
    [
        (LEAN_MIN_VOCAB - 1, None, False),  # auto: below the threshold the full logits are faster
        (LEAN_MIN_VOCAB, None, True),  # auto: from it on the lean loss
        (LEAN_MIN_VOCAB - 1, True, True),  # forced on
        (LEAN_MIN_VOCAB, False, False),  # forced off
    ],
)
def test_auto_takes_the_lean_loss_from_the_vocabulary_where_it_pays(caplog, vocab, lean_loss, active):
    module = HFLightningModule(tiny_llama(vocab_size=vocab), lean_loss=lean_loss)
    assert module.lean.active is active and pays(vocab) is (vocab >= LEAN_MIN_VOCAB)
    with caplog.at_level(logging.INFO, logger="hf_lightning.module.lean_loss"):
        module._say_lean()
    (line,) = [r.getMessage() for r in caplog.records]  # the INFO line says which path and why
    if lean_loss is None:
        chosen = f"module.lean_loss=null chose {'it' if active else 'them'}"
        assert chosen in line and f"{vocab} outputs" in line and str(LEAN_MIN_VOCAB) in line
    assert line.startswith("lean loss: on" if active else "the loss is computed from the full logits: ")
    assert ("module.lean_loss=false" in line) is (lean_loss is False or active)


def test_the_default_is_auto():
    assert inspect.signature(HFLightningModule).parameters["lean_loss"].default is None


def test_a_model_without_a_linear_head_keeps_the_logits():
    module = HFLightningModule(TableLM())
    assert "no LM head reachable by get_output_embeddings()" in module.lean.reason


def test_strategies_that_may_shard_the_head_turn_it_off():
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    from hf_lightning.strategies import fsdp_strategy

    assert strategy_reason(SingleDeviceStrategy("cpu")) is None and strategy_reason(DDPStrategy()) is None
    # FSDP2's root keeps the head's gathered weight until backward (LeanLoss.forward checks it per call)
    assert strategy_reason(ModelParallelStrategy()) is None and strategy_reason(fsdp_strategy()) is None
    assert "FSDPStrategy" in strategy_reason(FSDPStrategy())
    # DeepSpeedStrategy() needs deepspeed installed; the check reads the class only
    assert "DeepSpeedStrategy" in strategy_reason(DeepSpeedStrategy.__new__(DeepSpeedStrategy))


# ------------------------------------------------------------------------------ evaluation
def _eval(module, batch):
    module._eval_step(batch, 0, "val")
    metrics = module.eval_metrics["val"]
    return float(metrics["loss"].compute()), float(metrics["accuracy"].compute())


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_val_loss_and_accuracy_equal_the_plain_path(arch):
    lean, plain = _pair(arch)
    batch, _ = _batch()
    # make the accuracy neither 0 nor 1: half the labels are the model's own argmax predictions
    with torch.no_grad():
        preds = plain.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).logits.argmax(-1)
    labels = batch["labels"].clone()
    labels[:, 1::2] = torch.where(labels[:, 1::2] != -100, preds[:, :-1][:, 0::2], -100)
    batch["labels"] = labels
    loss, accuracy = _eval(lean, batch)
    ref_loss, ref_accuracy = _eval(plain, batch)
    assert 0.2 < ref_accuracy < 0.9
    assert loss == pytest.approx(ref_loss, rel=TOL) and accuracy == ref_accuracy


def test_compute_metrics_gets_the_full_logits_in_evaluation():
    seen = []
    lean = HFLightningModule(
        make_arch_model("llama"), compute_metrics=lambda p: seen.append(p) or {}, lean_loss=True
    )
    batch, _ = _batch()
    lean._collector.reset()
    lean._eval_step(batch, 0, "val")
    preds, _ = lean._collector.local_arrays()
    assert lean.lean.active and preds.shape == (*batch["labels"].shape, VOCAB)


# ------------------------------------------------------------------------------ memory
class LargestAllocation(TorchDispatchMode):
    """Records the largest storage (elements) that any op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_no_tokens_x_vocab_tensor_is_ever_allocated(stage):
    # a vocabulary large against the model (2,048 x hidden 32): the logits are the largest tensors of a step
    model = tiny_llama(vocab_size=2048)
    lean, plain = HFLightningModule(model), HFLightningModule(copy.deepcopy(model), lean_loss=False)
    lean.lean.chunk_size = 8
    ids, mask, labels = _pad(make_rows())
    batch, count = (
        {"input_ids": ids, "attention_mask": mask, "labels": labels},
        int((labels[:, 1:] != -100).sum()),
    )
    tokens_x_vocab = labels.numel() * 2048
    largest = {}
    for name, module in (("lean", lean), ("plain", plain)):
        with LargestAllocation() as mode:
            if stage == "train":
                loss, _ = module.compute_loss(batch, count)
                loss.backward()
            else:
                module._eval_step(batch, 0, "val")
        largest[name] = mode.largest
    assert largest["plain"] >= tokens_x_vocab  # the control: the plain path does hold the logits
    assert largest["lean"] < tokens_x_vocab / 4, largest


def _seq2seq_model(kind):
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    if kind == "t5":  # a tied head: T5 scales the decoder's output by d_model ** -0.5 before it
        config = T5Config(
            vocab_size=300,
            d_model=32,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            d_kv=8,
            decoder_start_token_id=0,
            dropout_rate=0.0,
        )
        return T5ForConditionalGeneration(config)
    config = BartConfig(
        vocab_size=300,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    return BartForConditionalGeneration(config)


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_an_encoder_decoder_takes_the_lean_loss_with_the_plain_paths_loss_and_gradients(kind):
    """The decoder's labels are the head's targets as they are (no shift); the head's input is captured after
    whatever the model does before it (T5's rescaling), and the decoder inputs come from the labels."""
    model = _seq2seq_model(kind).train()
    lean = HFLightningModule(model)  # auto: a vocabulary of 300 takes the lean loss
    lean.lean.chunk_size = 5
    plain = HFLightningModule(copy.deepcopy(model), lean_loss=False)
    assert lean.lean.active, lean.lean.reason
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(3, 300, (3, 9), generator=g)
    labels[0, 6:] = -100
    labels[2, 4:] = -100
    batch = {"input_ids": torch.randint(3, 300, (3, 11), generator=g), "attention_mask": torch.ones(3, 11)}
    batch["attention_mask"][1, 8:] = 0
    batch["labels"] = labels
    count = int((labels != -100).sum())
    loss, outputs, grads = _loss_and_grads(lean, batch, count)
    ref_loss, ref_outputs, ref_grads = _loss_and_grads(plain, batch, count)
    assert outputs.logits is None and ref_outputs.logits.shape == (3, 9, 300)
    assert rel(loss, ref_loss) <= TOL
    # HF's own loss of the model: the mean token CE over the decoder labels
    with torch.no_grad():
        hf = copy.deepcopy(model)(**batch).loss
    assert rel(ref_loss, hf) <= TOL
    assert grads.keys() == ref_grads.keys()
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    for name in ref_grads:
        if ref_grads[name].abs().max() < 1e-8 * scale:  # zero but for rounding (a key bias under softmax)
            assert grads[name].abs().max() < 1e-8 * scale, name
            continue
        assert rel(grads[name], ref_grads[name]) <= TOL, name
