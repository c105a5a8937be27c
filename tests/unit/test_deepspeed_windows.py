"""DeepSpeed steps at the end of our accumulation windows, the short last window of an epoch included: the
real engine (DeepSpeed's CPU accelerator, one process, ZeRO-2 and ZeRO-3) against the same run without
DeepSpeed.

5 micro-batches per epoch, 2 epochs, accumulation 2. By hand: windows of 2, 2, 1 micro-batches per epoch, so 6
optimizer steps, and a linear schedule over 6 steps from lr 0.01 uses 0.01 x (1 - i/6) at step i. Left to
itself the engine steps whenever its own micro-step counter (running across epochs) hits a multiple of 2:
after micro-batches 2, 4, 6, 8, 10, one window spanning the two epochs, and its weights would differ.
Needs the ``deepspeed`` package (the test extra installs it).
"""

from __future__ import annotations

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import PadOnly
from tests.parity.tiny_llama_case import make_model, make_rows

pytest.importorskip("deepspeed")

# the engine's start-up (a gloo group, DeepSpeed's shared-memory op built on a machine's first run)
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

LR = 0.01
ROWS, MICRO_BATCH, ACCUMULATION, EPOCHS = 10, 2, 2, 2


class Windows(L.Callback):
    """The length of each training batch's window and the learning rate its step uses, in order."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lengths.append(len(batch))
        self.lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))


def fit(strategy, state):
    model = make_model()
    model.load_state_dict(state)
    module = HFLightningModule(
        model,
        optim={"name": "adamw", "lr": LR},
        scheduler={"name": "linear", "warmup_steps": 0},
        # the loss from the logits on both sides: DeepSpeed may shard the head, so the lean loss is off there,
        # and a chunked loss sums in another order (equal to rounding, not bit for bit)
        lean_loss=False,
        max_grad_norm=1.0,
    )
    data = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(make_rows(ROWS)),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=MICRO_BATCH,
        max_length=64,
        seed=0,
        gradient_accumulation_steps=ACCUMULATION,
    )
    windows = Windows()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[windows],
    )
    trainer.fit(module, datamodule=data)
    return trainer, module, windows


def cut(lengths: list[int]) -> list[list[int]]:
    """Micro-batch indices grouped into windows of these lengths."""
    out, i = [], 0
    for n in lengths:
        out.append(list(range(i, i + n)))
        i += n
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_the_engine_steps_at_our_windows_with_the_schedule_of_their_count(stage, monkeypatch):
    from hf_lightning.strategies.deepspeed import deepspeed_strategy

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    state = make_model().state_dict()
    plain, plain_module, _ = fit("auto", state)
    linear = torch.nn.functional.linear

    strategy = deepspeed_strategy(
        stage=stage,
        micro_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        max_grad_norm=1.0,
        precision="32-true",
        devices=1,
    )
    trainer, module, windows = fit(strategy, state)
    engine = trainer.strategy.model
    assert torch.nn.functional.linear is linear  # ZeRO-3's replacement is undone at the strategy's teardown

    by_hand = [[0, 1], [2, 3], [4], [5, 6], [7, 8], [9]]
    assert cut(windows.lengths) == by_hand  # the windows the loss was normalised over
    assert trainer.global_step == engine.global_steps == 6  # the engine's real updates
    assert windows.lrs == pytest.approx([LR * (1 - i / 6) for i in range(6)], rel=1e-6)
    # the same updates as the run without DeepSpeed (AdamW, clipped by the engine at 1.0): equal to rounding,
    # which AdamW's division by sqrt(v) enlarges where a gradient is near zero (ZeRO-3 sums in another order);
    # a window stepped at the wrong micro-batch moves weights by about the lr (1e-2)
    assert plain.global_step == 6
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.model.parameters())):
        ours = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    theirs = plain_module.model.state_dict()
    largest = max(float(t.abs().max()) for t in theirs.values())
    for name, tensor in theirs.items():
        assert float((ours[name] - tensor).abs().max()) <= 2e-5 * largest, name


def test_our_deepspeed_strategy_counts_as_deepspeed():
    """Gradients under DeepSpeed live in the engine: no norm from ``p.grad``, no clipping of our own (the
    engine clips), and ``on_nonfinite=skip`` refused. ``HFDeepSpeedStrategy`` was missed (the check read the
    class name's prefix), so the module clipped and the engine clipped again."""
    from hf_lightning.module.grad_norm import gradients_outside_params
    from hf_lightning.strategies.deepspeed import deepspeed_strategy

    strategy = deepspeed_strategy(
        stage=2,
        micro_batch_size=2,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        precision="32-true",
        devices=1,
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, strategy=strategy, logger=False, enable_checkpointing=False
    )
    assert gradients_outside_params(trainer)
