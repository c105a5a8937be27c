"""The train loader's epoch and resume position in a loop without a Lightning trainer."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch

from hf_lightning import HFDataModule
from hf_lightning.core.errors import ConfigError

N = 10
SEED = 3
TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i : i + 2 + i % 3]) for i in range(N)]  # distinct rows


def datamodule(tok, **kw) -> HFDataModule:
    args = dict(validation_split=0.0, per_device_train_batch_size=3, seed=SEED)
    names = ["input_ids", "attention_mask"]
    return HFDataModule(
        tok, path=datasets.Dataset.from_dict({"text": TEXTS}), model_input_names=names, **{**args, **kw}
    )


def first_tokens(loader) -> list[int]:
    """The first token of every row of one pass (each text starts with its own word)."""
    return [int(t) for batch in loader for t in batch["input_ids"][:, 0]]


def position(dm) -> tuple[int, int]:
    state = dm.state_dict()
    return state["epoch"], state["batches_consumed"]


def torch_order(epoch: int) -> list[int]:
    """``torch.utils.data.DistributedSampler``'s order of ``epoch`` for one process, as first tokens."""
    sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return [4 + i for i in sampler]  # text i starts with letter i ('a' = 4)


def test_each_pass_without_a_trainer_is_the_next_epoch(word_tokenizer):
    dm = datamodule(word_tokenizer)
    loader = dm.train_dataloader()
    assert first_tokens(loader) == torch_order(0)
    assert first_tokens(loader) == torch_order(1)
    assert first_tokens(dm.train_dataloader()) == torch_order(2)  # a new loader continues the count
    assert torch_order(0) != torch_order(1)
    assert position(dm) == (3, 0)


def test_set_epoch_chooses_the_epoch_of_the_next_pass(word_tokenizer):
    loader = datamodule(word_tokenizer).train_dataloader()
    first_tokens(loader)
    loader.set_epoch(0)  # HF Trainer's call
    assert first_tokens(loader) == torch_order(0)
    loader.sampler.set_epoch(5)  # the DistributedSampler habit
    assert first_tokens(loader) == torch_order(5)
    assert first_tokens(loader) == torch_order(6)


def test_a_pass_left_early_is_followed_by_the_next_epoch(word_tokenizer):
    dm = datamodule(word_tokenizer)
    loader = dm.train_dataloader()
    next(iter(loader))
    assert position(dm) == (0, 1)
    assert first_tokens(loader) == torch_order(1)


def test_a_loaded_position_continues_the_epoch_then_the_next(word_tokenizer):
    straight = datamodule(word_tokenizer).train_dataloader()
    whole = first_tokens(straight) + first_tokens(straight)
    saved = datamodule(word_tokenizer)
    loader = saved.train_dataloader()
    for _, _ in zip(range(6), (b for _ in range(2) for b in loader)):  # 4 batches of epoch 0, 2 of epoch 1
        pass
    state = saved.state_dict()
    assert position(saved) == (1, 2)
    resumed = datamodule(word_tokenizer)
    resumed.load_state_dict(state)
    rest = first_tokens(resumed.train_dataloader())
    assert rest == whole[N + 2 * 3 :]  # the last two batches of epoch 1 (3 + 1 rows)


@pytest.mark.parametrize(
    "state,found",
    [
        ({"epoch": 1}, "['epoch']"),
        ({"epoch": -1, "batches_consumed": 0}, "['batches_consumed', 'epoch']"),
        ({"epoch": 1.5, "batches_consumed": 2}, "['batches_consumed', 'epoch']"),
        ({"model.weight": torch.zeros(1)}, "['model.weight']"),
    ],
)
def test_a_dict_that_is_not_a_position_is_refused(word_tokenizer, state, found):
    with pytest.raises(ConfigError) as caught:
        datamodule(word_tokenizer).load_state_dict(state)
    assert str(caught.value) == (
        "HFDataModule.load_state_dict: expected the dict of HFDataModule.state_dict() (non-negative int "
        f"'epoch' and 'batches_consumed'), got {found}"
    )


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hf_lightning.data.datamodule"]


def test_a_changed_setting_is_named_when_the_loop_continues(word_tokenizer, caplog):
    saved = datamodule(word_tokenizer)
    saved.train_dataloader()
    state = saved.state_dict()
    dm = datamodule(word_tokenizer, per_device_train_batch_size=2)
    dm.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="hf_lightning.data.datamodule"):
        dm.train_dataloader()
    assert said(caplog) == [
        "resuming with data settings that changed since the state was saved, so the loop cannot continue "
        "exactly as it would have: per_device_train_batch_size: 3 -> 2"
    ]
    caplog.clear()
    # the rows themselves: packed (other rows: the dataset's fingerprint changes too), or in length groups
    for changed, shown in (
        ({"packing": "bfd"}, "dataset_fingerprint: "),
        ({"group_by_length": True}, "group_by_length: False -> True"),
    ):
        dm = datamodule(word_tokenizer, **changed)
        dm.load_state_dict(state)
        with caplog.at_level(logging.WARNING, logger="hf_lightning.data.datamodule"):
            dm.train_dataloader()
        (line,) = said(caplog)
        assert shown in line, line
        caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_lightning.data.datamodule"):
        same = datamodule(word_tokenizer)
        same.load_state_dict(state)
        same.train_dataloader()
    assert said(caplog) == []
