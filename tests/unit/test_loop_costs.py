"""What hf_lightning adds to every micro-batch, counted in tensor operations.

Timing a loop in a test would be flaky; the number of torch calls is not. Counted with a ``TorchFunctionMode``
(every ``torch.*`` function and ``Tensor`` method call) during a real fit, outside the model's forward and the
loss itself, which are the work a hand-written loop does too.
"""

from __future__ import annotations

import math

import datasets
import pytest
import torch
from torch.overrides import TorchFunctionMode

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import NonFiniteGuard
from tests.data_support import tiny_llama
from tests.errors.support import trainer

TEXTS = ["a b c d e", "b c d", "c d e f g h", "d e", "e f g h", "a c e g", "a b", "c d e f"]


class CountCalls(TorchFunctionMode):
    """Counts torch calls while ``on`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.on, self.calls = False, []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.on:
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_training_step_adds_at_most_three_tensor_ops_per_micro_batch(tmp_path, word_tokenizer):
    # the window step's own work around compute_loss, backward and the update: per micro-batch the detached
    # share and its sum over the window; per window the zero it starts from. It was nine per micro-batch (a
    # multiply by a rank factor of 1, a padding mask, its inverse, a sum, a device move and an add per batch),
    # then four (a real-token count that repeated the Throughput callback's), then three (the factor that
    # undid Lightning's division by k)
    counter = CountCalls()
    seen = []

    def off(fn):
        def run(*args, **kwargs):
            on, counter.on = counter.on, False
            try:
                return fn(*args, **kwargs)
            finally:
                counter.on = on

        return run

    class Counted(HFLightningModule):
        def training_step(self, batch, batch_idx):
            counter.on, before = True, len(counter.calls)
            try:
                with counter:  # only around the step: the rest of the fit runs without the mode
                    return super().training_step(batch, batch_idx)
            finally:
                seen.append((len(batch), counter.calls[before:]))
                counter.on = False

        compute_loss = off(HFLightningModule.compute_loss)
        manual_backward = off(HFLightningModule.manual_backward)
        _step_schedule = off(HFLightningModule._step_schedule)

        def optimizers(self, *args, **kwargs):
            optimizer = super().optimizers(*args, **kwargs)
            optimizer.step, optimizer.zero_grad = off(optimizer.step), off(optimizer.zero_grad)
            return optimizer

    module = Counted(
        tiny_llama(vocab_size=32),
        tokenizer=word_tokenizer,
        optim={"name": "sgd", "lr": 0.0},
        scheduler={"name": "constant"},
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list([{"text": t} for t in TEXTS]),
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
    )
    trainer(tmp_path, max_steps=2).fit(module, datamodule=dm)
    assert [n for n, _ in seen] == [4, 4], seen
    for n, calls in seen:
        assert len(calls) <= 2 * n + 1, calls


def test_nonfinite_guard_does_nothing_per_micro_batch_and_still_finds_a_nan():
    # the window's losses are kept as they are and read with the norm, once per optimizer step; it used to
    # run five tensor ops per micro-batch (isfinite, all, invert, where, or)
    guard = NonFiniteGuard()
    counter = CountCalls()
    losses = [torch.tensor(1.0, requires_grad=True) * 1, torch.tensor(math.nan), torch.tensor(2.0)]
    with counter:
        counter.on = True
        for loss in losses:
            guard.on_before_backward(None, None, loss)
        counter.on = False
    assert counter.calls == ["detach"] * 3, counter.calls

    class OneRank:
        world_size = 1
        global_step = 6
        current_epoch = 0
        precision_plugin = object()
        strategy = object()
        loggers = []
        lightning_module = None

    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    optimizer = torch.optim.SGD([param], lr=0.1)
    with pytest.raises(Exception, match=r"optimizer step 7 .*the loss is nan"):
        guard.on_before_optimizer_step(OneRank(), torch.nn.Module(), optimizer)
