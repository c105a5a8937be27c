"""The run's real-token count (the ``done: ... real tokens/s`` line and ``train_tokens_per_s``, from the
``Throughput`` callback, the one place tokens are counted) covers every real token whatever the layout:
padding-free rows carry no ``attention_mask`` and used to count as 0."""

from __future__ import annotations

import datasets
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import Throughput
from tests.data_support import tiny_llama
from tests.errors.support import trainer

TEXTS = ["a b c d e", "b c d", "c d e f g h", "d e", "e f g h", "a c e g"]


@pytest.mark.parametrize("layout", [{}, {"padding_free": True}, {"packing": "bfd"}])
def test_trained_tokens_are_the_tokenized_lengths(tmp_path, word_tokenizer, layout):
    # independent count: the tokenizer's own lengths, plus the EOS that packing ends each text document with
    # (padding adds only pads)
    expected = sum(len(word_tokenizer(t)["input_ids"]) for t in TEXTS) + (
        len(TEXTS) if "packing" in layout else 0
    )
    module = HFLightningModule(
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
        per_device_train_batch_size=2,
        **layout,
    )
    meter = Throughput()
    trainer(tmp_path, max_epochs=1, max_steps=-1, callbacks=[meter]).fit(module, datamodule=dm)
    assert meter.run_real_tokens == expected
