"""HFDataModule with a LightningModule of one's own (``self.net``, not HFLightningModule).

What the data needs from the model side is bound by one explicit call (``dm.bind``) or declared by the module
(``data_binding()``); nothing else of the module is read. A module that averages its loss per micro-batch
(``outputs.loss``) under accumulation gets HF's biased fallback: one WARNING says so. The few lines of the
README that divide by ``num_items_in_batch`` give the exact gradient, the one HFLightningModule gets and a
hand computation over the whole window gives.
"""

from __future__ import annotations

import logging
import warnings

import datasets
import lightning as L
import pytest
import torch
import torch.nn.functional as F

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.module.loss import count_loss_items
from tests.data_support import tiny_llama

# rows of unequal lengths, so the two micro-batches of the first window hold different numbers of targets
TEXTS = ["a b c d e f g h", "i j", "k l m", "n o p q r s", "t u v", "w x y z a b c"] * 2
WINDOW_LOG = "hf_lightning.data.sampling"


class GradNorms(L.Callback):
    """The gradient norm of every optimizer step, before the update."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


class OutputsLoss(L.LightningModule):
    """The usual module of one's own: the HF model's own loss, a mean over the micro-batch."""

    def __init__(self, net, declares: bool = False) -> None:
        super().__init__()
        self.net = net.train()
        self.declares = declares

    def data_binding(self):
        return {"model": self.net, "count_loss_items": count_loss_items} if self.declares else {}

    def training_step(self, batch, batch_idx):
        return self.net(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def readme_module() -> type:
    """The ``MyModule`` of docs/python.md (section "Your own LightningModule"), executed as written there (its
    driver, under ``if __name__ == "__main__"``, runs in ``tests/integration/test_docs_snippets.py``)."""
    from tests.docs_support import docs_block

    code = docs_block("own-module")
    assert "class MyModule(" in code
    namespace: dict = {"__name__": "docs_python"}
    exec(compile(code, "docs/python.md", "exec"), namespace)
    return namespace["MyModule"]


def first_step_grad_norm(module, tokenizer, caplog) -> float:
    """The first optimizer step's gradient norm over windows of 2 micro-batches: Lightning's accumulation for
    a module on automatic optimization, the DataModule's windows for HFLightningModule."""
    windows = isinstance(module, HFLightningModule)
    dm = HFDataModule(
        tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=2,
        max_length=16,
        gradient_accumulation_steps=2 if windows else 1,
    )
    norms = GradNorms()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        accumulate_grad_batches=1 if windows else 2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[norms],
    )
    with caplog.at_level(logging.WARNING, logger=WINDOW_LOG):
        trainer.fit(module, datamodule=dm)
    (norm,) = norms.norms
    return norm


def hand_window_grad_norm(tokenizer) -> float:
    """The token mean over the first window (the first 4 rows), one backward, no padding."""
    model = tiny_llama(len(tokenizer))
    total, count = 0.0, 0
    for text in TEXTS[:4]:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        logits = model(input_ids=ids).logits
        total = total + F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
        count += ids.shape[1] - 1
    (total / count).backward()
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def window_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == WINDOW_LOG]


def test_the_readme_lines_give_the_exact_gradient_and_no_warning(word_tokenizer, caplog):
    exact = first_step_grad_norm(readme_module()(tiny_llama(len(word_tokenizer))), word_tokenizer, caplog)
    assert window_warnings(caplog) == []
    caplog.clear()
    ours = first_step_grad_norm(HFLightningModule(tiny_llama(len(word_tokenizer))), word_tokenizer, caplog)
    assert window_warnings(caplog) == []  # HFLightningModule reads the count: no false alarm
    hand = hand_window_grad_norm(word_tokenizer)
    assert exact == pytest.approx(hand, rel=1e-5)
    assert ours == pytest.approx(hand, rel=1e-5)


class TrainModes(L.Callback):
    """Whether every submodule of the module is in train mode at each training batch."""

    def __init__(self) -> None:
        self.modes: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.modes.append(all(m.training for m in pl_module.modules()))


def test_the_readme_module_trains_a_loaded_model_with_dropout_on(word_tokenizer, tmp_path):
    # from_pretrained returns the model in eval mode and Lightning keeps each submodule's mode (it calls no
    # .train() at fit start, only warns): before, the README's module fine-tuned it with dropout off
    from transformers import AutoModelForCausalLM

    tiny_llama(len(word_tokenizer), attention_dropout=0.1).save_pretrained(tmp_path)
    net = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not net.training and net.config.attention_dropout == 0.1
    dm = HFDataModule(
        word_tokenizer, path=datasets.Dataset.from_dict({"text": TEXTS}), validation_split=0.0, max_length=16
    )
    modes = TrainModes()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[modes],
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(readme_module()(net), datamodule=dm)
    assert modes.modes == [True, True]
    assert not [w for w in seen if "in eval mode at the start of training" in str(w.message)]


def test_outputs_loss_without_a_binding_gets_one_warning(word_tokenizer, caplog):
    biased = first_step_grad_norm(OutputsLoss(tiny_llama(len(word_tokenizer))), word_tokenizer, caplog)
    assert window_warnings(caplog) == [
        "the training batches carry no num_items_in_batch: nothing bound a count_loss_items "
        "(HFDataModule.bind, or a LightningModule with data_binding()), and a window spans "
        "trainer.accumulate_grad_batches=2 micro-batch(es) on 1 process(es): a loss averaged per micro-batch "
        "(a model's outputs.loss) is HF's biased fallback, which weighs the targets of a micro-batch by the "
        "inverse of its own count; bind one, then for the exact token mean divide the summed token loss by "
        "batch['num_items_in_batch'] (summed across ranks) and multiply by accumulate_grad_batches x world "
        "size (docs/python.md)"
    ]
    assert biased != pytest.approx(hand_window_grad_norm(word_tokenizer), rel=1e-3)  # the bias is real


def test_outputs_loss_with_the_count_bound_gets_one_warning(word_tokenizer, caplog):
    module = OutputsLoss(tiny_llama(len(word_tokenizer)), declares=True)
    first_step_grad_norm(module, word_tokenizer, caplog)
    assert window_warnings(caplog) == [
        "the training batches carry num_items_in_batch, the target count of each accumulation window "
        "(trainer.accumulate_grad_batches=2, 1 process(es)), but OutputsLoss.training_step did not read it: "
        "a loss averaged per micro-batch (a model's outputs.loss) is HF's biased fallback, which weighs the "
        "targets of a micro-batch by the inverse of its own count; for the exact token mean divide the "
        "summed token loss by batch['num_items_in_batch'] (summed across ranks) and multiply by "
        "accumulate_grad_batches x world size (docs/python.md)"
    ]


def test_nothing_but_data_binding_is_read_from_the_module(word_tokenizer):
    """A ``.model`` attribute binds nothing by itself: the explicit call does."""
    dm = HFDataModule(word_tokenizer, path=datasets.Dataset.from_dict({"text": TEXTS}), validation_split=0.0)
    dm.trainer = L.Trainer(accelerator="cpu", logger=False)
    holder = L.LightningModule()
    holder.model = tiny_llama(len(word_tokenizer))
    dm.trainer.strategy.connect(holder)
    assert dm._binding().model is None
    dm.bind(holder.model, count_loss_items=count_loss_items)
    assert dm._binding().model is holder.model


def test_a_window_length_for_a_module_on_automatic_optimization_is_refused(word_tokenizer):
    """Only a module that steps windows (``HFLightningModule``) takes ``gradient_accumulation_steps``; one on
    Lightning's automatic optimization accumulates with the Trainer's ``accumulate_grad_batches``: one
    ConfigError naming both, before any step."""
    from hf_lightning import ConfigError

    module = readme_module()(tiny_llama(len(word_tokenizer)))
    dm = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.0,
        gradient_accumulation_steps=2,
    )
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError) as err:
        trainer.fit(module, datamodule=dm)
    assert str(err.value) == (
        "data.gradient_accumulation_steps=2 needs a module that steps accumulation windows "
        "(HFLightningModule); a module on Lightning's automatic optimization accumulates with "
        "Trainer(accumulate_grad_batches=N): set that, and data.gradient_accumulation_steps=1"
    )
    assert trainer.global_step == 0
