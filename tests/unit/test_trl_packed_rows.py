"""Rows packed by ``trl.pack_dataset`` (``input_ids`` + ``seq_lengths``) keep their documents apart: the
``seq_lengths`` column survives column pruning, and the batches equal what TRL's own padding-free collator
(``trl.trainer.sft_trainer.DataCollatorForLanguageModeling(padding_free=True)``) makes of the same rows:
positions restarting at each document, each document's first label -100, no ``attention_mask``."""

from __future__ import annotations

import datasets
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import tiny_llama

trl = pytest.importorskip("trl")

TEXTS = ["a b c d e", "f g", "h i j", "k l m n", "o p", "q r s t u v", "w x", "y z a b"]


def packed(tokenizer, capacity=12):
    docs = datasets.Dataset.from_dict({"input_ids": [tokenizer(t)["input_ids"] for t in TEXTS]})
    return trl.pack_dataset(docs, capacity, "bfd")


def batches(dm):
    return [mb for window in dm.train_dataloader() for mb in window.micro_batches]


def trl_batch(rows):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": r["input_ids"], "seq_lengths": r["seq_lengths"]} for r in rows]
    )


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding_free", "padded_rows"])
def test_trl_packed_rows_batch_as_trls_collator_batches_them(word_tokenizer, padding_free):
    rows = packed(word_tokenizer)
    assert rows.column_names == ["input_ids", "seq_lengths"] and len(rows) < len(TEXTS)
    model = tiny_llama(len(word_tokenizer))
    dm = HFDataModule(
        word_tokenizer,
        path=rows,
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=2,
        max_length=12,
        padding_free=padding_free,
    )
    dm.bind(**HFLightningModule(model).data_binding())
    dm.setup("fit")
    assert dm.train_dataset["seq_lengths"] == rows["seq_lengths"]  # kept, not pruned
    for k, ours in enumerate(batches(dm)):
        theirs = trl_batch(rows.select(range(2 * k, min(2 * k + 2, len(rows)))))
        assert "attention_mask" not in ours
        if padding_free:  # one flat row, as TRL's
            for key in ("input_ids", "labels", "position_ids"):
                assert torch.equal(ours[key], theirs[key]), key
        else:  # one packed row per row, padded: its real part is TRL's, its padding never a target
            lengths = [sum(s) for s in rows.select(range(2 * k, min(2 * k + 2, len(rows))))["seq_lengths"]]
            for key in ("input_ids", "labels", "position_ids"):
                ours_flat = torch.cat([ours[key][i, :n] for i, n in enumerate(lengths)])
                assert torch.equal(ours_flat, theirs[key][0]), key
            assert int((ours["labels"] != -100).sum()) == int((theirs["labels"] != -100).sum())


def test_the_documents_do_not_attend_to_each_other(word_tokenizer):
    """The model's logits of a packed row equal those of its documents run one by one."""
    rows = packed(word_tokenizer)
    model = tiny_llama(len(word_tokenizer)).eval()
    dm = HFDataModule(
        word_tokenizer, path=rows, validation_split=0.0, shuffle=False, per_device_train_batch_size=1
    )
    dm.bind(**HFLightningModule(model).data_binding())
    dm.setup("fit")
    batch = batches(dm)[0]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        start = 0
        for n in rows[0]["seq_lengths"]:
            alone = model(input_ids=batch["input_ids"][:, start : start + n]).logits[0]
            torch.testing.assert_close(logits[start : start + n], alone, rtol=1e-5, atol=1e-5)
            start += n


def test_a_row_cut_at_max_length_keeps_lengths_that_add_up(word_tokenizer, caplog):
    rows = datasets.Dataset.from_dict({"input_ids": [[4, 5, 6, 7, 8, 9, 10]], "seq_lengths": [[3, 2, 2]]})
    dm = HFDataModule(word_tokenizer, path=rows, validation_split=0.0, max_length=4)
    dm.setup("fit")
    row = dm.train_dataset[0]
    assert row["input_ids"] == [4, 5, 6, 7] and row["seq_lengths"] == [3, 1]
    assert row["labels"] == [-100, 5, 6, -100]
    assert (
        "1 of 1 rows were longer than data.max_length=4 and were truncated (3 tokens cut off)" in caplog.text
    )
