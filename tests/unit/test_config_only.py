"""HFDataModule and HFLightningModule built from configs alone, the way another Hydra project builds its
objects: ``hydra.utils.instantiate(cfg.data)``, ``hydra.utils.instantiate(cfg.model)``
(lightning-hydra-template's ``src/train.py``), with the config files shipped in
``examples/lightning-hydra-template/configs``.

The tokenizer and the model are named by folder (or built by a ``_target_`` node of their own); the optimizer
and the schedule come as ``_partial_`` nodes of torch / transformers classes, as that template passes them.
Expected values: the tokenizer and model loaded by ``transformers`` directly, the parameter groups by hand (a
Llama's norm weights are the only parameters without weight decay: it has no biases), the learning rates from
the torch / transformers schedule run on its own.
"""

from __future__ import annotations

import functools
import json

import hydra
import lightning as L
import pytest
import torch
import transformers
from omegaconf import OmegaConf

from hf_lightning import ConfigError, HFDataModule, HFLightningModule, ModelError
from hf_lightning.module.optim import make_optimizer
from tests.data_support import REPO, tiny_llama

SHIPPED = REPO / "examples" / "lightning-hydra-template" / "configs"
TEXTS = ["a b c d e", "f g h", "i j k l", "m n o", "p q r s t u", "v w x", "y z a b", "c d e f"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, word_tokenizer):
    """A tiny Llama and its tokenizer saved by ``save_pretrained``: what ``model.model=DIR`` names."""
    folder = tmp_path_factory.mktemp("tiny_model")
    tiny_llama(len(word_tokenizer)).save_pretrained(folder)
    word_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return str(path)


def shipped_config(**overrides):
    """``{data: ..., model: ...}`` from the shipped files, with ``overrides`` (dotted keys) set."""
    cfg = OmegaConf.create(
        {
            "data": OmegaConf.load(SHIPPED / "data" / "hf.yaml"),
            "model": OmegaConf.load(SHIPPED / "model" / "hf.yaml"),
        }
    )
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def small_trainer(**kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def test_the_shipped_configs_instantiate_and_train_with_no_glue(model_dir, data_file):
    cfg = shipped_config(
        **{
            "model.model": model_dir,
            "data.path": data_file,
            "data.test_path": data_file,
            "data.max_length": 16,
            "data.gradient_accumulation_steps": 2,
        }
    )
    dm = hydra.utils.instantiate(cfg.data)
    module = hydra.utils.instantiate(cfg.model)
    assert isinstance(dm, HFDataModule) and isinstance(module, HFLightningModule)

    reference = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert [dm.tokenizer(t)["input_ids"] for t in TEXTS] == [reference(t)["input_ids"] for t in TEXTS]
    saved = transformers.AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in module.model.state_dict().items())

    trainer = small_trainer(max_steps=2, limit_val_batches=1)
    trainer.fit(module, datamodule=dm)
    (tested,) = trainer.test(module, datamodule=dm, verbose=False)
    assert trainer.global_step == 2 and tested["test/loss"] > 0

    (optimizer,) = trainer.optimizers  # torch.optim.AdamW from the partial, over HF's two groups
    assert type(optimizer) is torch.optim.AdamW
    names = {id(p): n for n, p in module.model.named_parameters()}
    decayed, plain = optimizer.param_groups
    assert (decayed["lr"], decayed["weight_decay"], plain["weight_decay"]) == (
        pytest.approx(3e-4 * 0.2),
        0.01,
        0.0,
    )
    assert sorted(names[id(p)] for p in plain["params"]) == sorted(n for n in names.values() if "norm" in n)
    assert len(decayed["params"]) + len(plain["params"]) == len(names)


def test_a_tokenizer_node_of_its_own(model_dir, data_file):
    node = {
        "_target_": "transformers.AutoTokenizer.from_pretrained",
        "pretrained_model_name_or_path": model_dir,
    }
    cfg = shipped_config(**{"model.model": model_dir, "data.path": data_file, "data.tokenizer": node})
    dm = hydra.utils.instantiate(cfg.data)
    reference = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert dm.tokenizer("a b c")["input_ids"] == reference("a b c")["input_ids"] == [4, 5, 6]


class LearningRates(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


def lrs_used(scheduler, word_tokenizer, data_file, steps=3) -> list[float]:
    dm = HFDataModule(word_tokenizer, path=data_file, validation_split=0.0, per_device_train_batch_size=2)
    module = HFLightningModule(
        tiny_llama(len(word_tokenizer)), optim=functools.partial(torch.optim.SGD, lr=0.1), scheduler=scheduler
    )
    seen = LearningRates()
    small_trainer(max_steps=steps, callbacks=[seen], limit_val_batches=0).fit(module, datamodule=dm)
    return seen.lrs


def lrs_alone(make, steps=3) -> list[float]:
    """The same schedule run by itself on a fresh optimizer: the rate before each step."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule, out = make(optimizer), []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return out


def test_torch_and_transformers_schedule_partials_step_every_optimizer_step(word_tokenizer, data_file):
    step_lr = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    assert lrs_used(step_lr, word_tokenizer, data_file) == pytest.approx(lrs_alone(step_lr))
    assert lrs_alone(step_lr) == pytest.approx([0.1, 0.05, 0.025])
    linear = functools.partial(transformers.get_linear_schedule_with_warmup, num_warmup_steps=1)
    assert lrs_used(linear, word_tokenizer, data_file) == pytest.approx(
        lrs_alone(lambda opt: linear(opt, num_training_steps=3))
    )


def test_a_model_or_tokenizer_folder_that_is_not_one_is_named(tmp_path, word_tokenizer):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ModelError) as err:
        HFLightningModule(missing)
    assert str(err.value) == f"module.model={missing}: not a folder (expected a local HF model folder)"
    with pytest.raises(ModelError) as err:
        HFDataModule(missing)
    assert str(err.value) == (
        f"data.tokenizer={missing}: not a folder (expected a local tokenizer folder or a hub id)"
    )


def test_an_optimizer_class_without_a_default_learning_rate_needs_one(word_tokenizer):
    module = HFLightningModule(
        tiny_llama(len(word_tokenizer)), optim=functools.partial(transformers.optimization.Adafactor)
    )
    with pytest.raises(ConfigError) as err:
        make_optimizer(module.optim, module.model)
    assert str(err.value) == "optim: Adafactor has no default learning rate; give it lr"
