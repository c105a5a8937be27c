"""A ``datasets.Dataset`` with a transform or a format is trained on what its rows return.

Before: ``set_transform`` tokenizing on access crashed at setup with ``KeyError: 'text'`` (the format was read
off the stored columns, ``Dataset.map`` handed over the transformed ones); a transform that renames columns
was refused as an unknown format; ``set_format(columns=[...])`` trained on stored columns the format hides.

The oracle: the rows the dataset returns when indexed (what HF ``Trainer`` trains on), copied into a plain
``Dataset.from_list``; both must give the same batches, train and validation.
"""

from __future__ import annotations

import datasets
import pytest
import torch

from hf_lightning import HFDataModule
from hf_lightning.core.errors import DataError
from tests.data_support import make_word_tokenizer

TOK = make_word_tokenizer()
TEXTS = ["a b c d", "e f g", "h i j k l", "m n", "o p q r", "s t u", "v w x y z", "b d f h"] * 2


def returned_rows(ds: datasets.Dataset) -> datasets.Dataset:
    """What ``ds[i]`` gives, row by row, as a plain dataset (tensors as lists)."""
    rows = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in ds[i].items()} for i in range(len(ds))]
    return datasets.Dataset.from_list(rows)


def batches(source) -> list[dict[str, torch.Tensor]]:
    dm = HFDataModule(
        TOK,
        path=source,
        per_device_train_batch_size=3,
        per_device_eval_batch_size=3,
        max_length=8,
        validation_split=0.25,
    )
    dm.setup("fit")
    return list(dm.train_dataloader()) + list(dm.val_dataloader())


def assert_same_batches(got, expected) -> None:
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert sorted(a) == sorted(b)
        for key in a:
            assert torch.equal(a[key], b[key]), key


def _tokenize(batch):
    return TOK(batch["text"], truncation=True, max_length=16)


def test_set_transform_that_tokenizes_on_access():
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    ds.set_transform(_tokenize)
    assert ds.column_names == ["text"] and "text" not in ds[0]  # stored vs returned
    assert_same_batches(batches(ds), batches(returned_rows(ds)))


def test_with_transform_that_renames_into_prompt_and_completion():
    ds = datasets.Dataset.from_dict({"question": TEXTS, "answer": TEXTS[::-1]})
    shown = ds.with_transform(lambda b: {"prompt": b["question"], "completion": b["answer"]})
    expected = batches(returned_rows(shown))
    assert_same_batches(batches(shown), expected)
    # the completion-only mask of the prompt/completion format: prompt positions are -100
    assert any((b["labels"] == -100).any() for b in expected)


def test_transformed_dataset_dict_splits():
    parts = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TEXTS}).with_transform(_tokenize),
            "validation": datasets.Dataset.from_dict({"text": TEXTS[:3]}).with_transform(_tokenize),
        }
    )
    plain = datasets.DatasetDict({k: returned_rows(v) for k, v in parts.items()})
    assert_same_batches(batches(parts), batches(plain))


def test_set_format_columns_hides_stored_columns():
    """Stored ``input_ids`` from another tokenization are hidden by the format: the returned ``text`` is
    used."""
    ds = datasets.Dataset.from_dict({"text": TEXTS, "input_ids": [[5, 5, 5]] * len(TEXTS)})
    ds.set_format(columns=["text"])
    expected = batches(returned_rows(ds))
    assert_same_batches(batches(ds), expected)
    assert not all((b["input_ids"] == 5).all() for b in expected)


def test_torch_format_with_a_column_subset():
    """``set_format("torch", columns=["input_ids"])`` hides the stored labels: every token is a target."""
    ids = [TOK(t)["input_ids"] for t in TEXTS]
    ds = datasets.Dataset.from_dict(
        {"input_ids": ids, "labels": [[-100] * (len(x) - 1) + [x[-1]] for x in ids]}
    )
    ds.set_format("torch", columns=["input_ids"])
    expected = batches(returned_rows(ds))
    assert_same_batches(batches(ds), expected)
    ours = batches(ds)
    assert sum(int((b["labels"] != -100).sum()) for b in ours) == sum(
        int(b["attention_mask"].sum()) for b in ours
    )


def test_a_transform_that_fails_names_the_dataset():
    ds = datasets.Dataset.from_dict({"text": TEXTS}).with_transform(lambda b: {"input_ids": b["txt"]})
    with pytest.raises(DataError) as err:
        batches(ds)
    assert str(err.value) == (
        "data.path=<in-memory dataset>: reading its rows through the dataset's transform (set_transform / "
        "with_transform) failed: KeyError: 'txt'. Fix the transform, or apply it with Dataset.map and pass "
        "the result"
    )
