"""One gradient-norm pass per optimizer step, shared by the log line, norm clipping and ``NonFiniteGuard``.

Each case trains a real tiny Llama with a real ``lightning.Trainer`` twice on the same rows: once with the
shared norm (the default) and once with the pre-sharing behaviour (``torch.nn.utils.clip_grad_norm_``'s own
pass, the guard's and the log line's own passes: a module whose ``step_gradient_norm`` is absent). The weights
after every step must be bit-identical, the logged ``grad_norm`` must equal an independent ``clip_grad_norm_``
of the same gradients, and the number of ``get_total_norm`` calls per step must drop from three to one."""

from __future__ import annotations

import re

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import NonFiniteGuard
from tests.data_support import tiny_llama
from tests.errors.support import trainer

ROWS = [
    {"text": t}
    for t in ("a b c d e", "b c d", "c d e f g h", "d e", "e f g h", "a c e g", "b d f h", "h g f")
] * 2
STEPS = 4


class Unshared(HFLightningModule):
    """The behaviour before the shared norm: every reader computes its own, Lightning clips with its own."""

    step_gradient_norm = None  # NonFiniteGuard falls back to its own pass

    def on_before_optimizer_step(self, optimizer):
        self.train_rows.lr = optimizer.param_groups[0]["lr"]
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.train_rows.grad_norm = torch.nn.utils.get_total_norm(grads)
        # what Lightning's precision plugin clipped: the optimizer's parameters, in its order
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)


class Record(L.Callback):
    """Per step: the weights after it, and an independent pre-clip norm of its gradients (read before any hook
    of the module or the guard can touch them: this callback is registered first)."""

    def __init__(self):
        self.weights, self.norms = [], []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        grads = [p.grad.detach().clone() for p in module.parameters() if p.grad is not None]
        self.norms.append(
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        )

    def on_train_batch_end(self, trainer, module, *args):
        if len(self.weights) < trainer.global_step:
            self.weights.append({k: v.detach().clone() for k, v in module.model.named_parameters()})


class Logged(L.Callback):
    """The module's ``grad_norm`` as it is about to be logged (log_every_n_steps=1: every step)."""

    def __init__(self):
        self.norms = []

    def on_train_batch_end(self, trainer, module, *args):
        if module.train_rows.grad_norm is not None and len(self.norms) < trainer.global_step:
            self.norms.append(float(module.train_rows.grad_norm))


def train(tmp_path, word_tokenizer, cls, monkeypatch, clip=0.05):
    calls = []
    real = torch.nn.utils.get_total_norm

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    # counted where every reader looks it up: the public name, and the private one clip_grad_norm_ calls
    real_private = torch.nn.utils.clip_grad._get_total_norm

    def counting_private(*args, **kwargs):
        calls.append(1)
        return real_private(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "get_total_norm", counting)
    monkeypatch.setattr(torch.nn.utils.clip_grad, "_get_total_norm", counting_private)
    module = cls(
        tiny_llama(vocab_size=32),
        optim={"name": "adamw", "lr": 1e-2, "weight_decay": 0.1},
        scheduler={"name": "constant"},
        max_grad_norm=clip,
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(ROWS),
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    record, logged = Record(), Logged()
    t = trainer(
        tmp_path / cls.__name__,
        max_steps=STEPS,
        log_every_n_steps=1,
        callbacks=[record, NonFiniteGuard(grad_norm_spike=None), logged],
    )
    t.fit(module, datamodule=dm)
    return record, logged, len(calls)


def test_one_norm_pass_per_step_same_weights_and_logged_norm(tmp_path, word_tokenizer, monkeypatch):
    shared, shared_log, shared_calls = train(tmp_path, word_tokenizer, HFLightningModule, monkeypatch)
    old, old_log, old_calls = train(tmp_path, word_tokenizer, Unshared, monkeypatch)

    assert len(shared.weights) == len(old.weights) == STEPS
    # the clip is active (norms far above 0.05), so a wrong clip coefficient would show in the weights
    assert min(shared.norms) > 0.05 * 10
    for step in range(STEPS):
        assert all(
            torch.equal(shared.weights[step][k], old.weights[step][k]) for k in shared.weights[step]
        ), step
    # the logged norm is the pre-clip norm of the step's gradients, as HF logs clip_grad_norm_'s return value
    assert shared_log.norms == pytest.approx(shared.norms, rel=1e-5)
    assert old_log.norms == pytest.approx(old.norms, rel=1e-5)
    # log line + guard + clipping: three passes per step before, one now
    assert old_calls == 3 * STEPS
    assert shared_calls == STEPS


@pytest.mark.parametrize(
    "kwargs,says",
    [
        ({"gradient_clip_val": 1e-3}, "set HFLightningModule(max_grad_norm=0.001)"),
        ({"accumulate_grad_batches": 2}, "set HFDataModule(gradient_accumulation_steps=2)"),
    ],
)
def test_lightnings_clipping_and_accumulation_are_refused_naming_ours(tmp_path, word_tokenizer, kwargs, says):
    """The module steps its windows itself: Lightning's clipping and accumulation cannot act, and are refused
    in one line naming HF's keys before any step."""
    from hf_lightning import ConfigError

    module = HFLightningModule(
        tiny_llama(vocab_size=32), optim={"name": "sgd"}, scheduler={"name": "constant"}
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer, path=datasets.Dataset.from_list(ROWS), validation_split=0.0, shuffle=False
    )
    with pytest.raises(ConfigError, match=re.escape(says)):
        trainer(tmp_path, max_steps=2, **kwargs).fit(module, datamodule=dm)
    assert module.global_step == 0
