"""The Arrow packing engine on real data (c4-demo, GSM8K; GPT-2 BPE) against ``trl.pack_dataset`` and against
the pure-Python packing it replaced (``tests/packing_oracle.py``), row for row.

TRL packs inside ``Dataset.map(batched=True)``: each map batch (1,000 documents by default) is packed on its
own. Our rows are those of one batch holding every document (``map_kwargs={"batch_size": len(ds)}``); the
default batching is checked here too, since the module's opening comment states what it does.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest

from hf_lightning.data.packing import best_fit_decreasing, pack_bfd, pack_wrapped
from tests import packing_oracle as old

pytestmark = pytest.mark.slow
MAX_LENGTH = 512


def _tokenized(tokenizer, texts, prompts=None):
    """``tokenizer(text + eos)`` cut to ``MAX_LENGTH`` (as tokenization does before bfd); labels with the
    prompt (when given) masked."""
    ids = tokenizer([t + tokenizer.eos_token for t in texts])["input_ids"]
    ids = [x[:MAX_LENGTH] for x in ids]
    if prompts is None:
        return {"input_ids": ids}
    prompt_lengths = [len(p) for p in tokenizer(prompts)["input_ids"]]
    labels = [[-100] * min(n, len(x)) + x[n:] for n, x in zip(prompt_lengths, ids)]
    return {"input_ids": ids, "labels": labels}


@pytest.fixture(scope="module")
def real(gpt2_tokenizer, shared_data):
    lines = Path(shared_data, "c4-demo", "c4_demo.jsonl").read_text().splitlines()
    c4 = _tokenized(gpt2_tokenizer, [json.loads(line)["text"] for line in lines])
    rows = [json.loads(line) for line in Path(shared_data, "gsm8k", "train.jsonl").read_text().splitlines()]
    prompts = [r["question"] for r in rows]
    gsm8k = _tokenized(gpt2_tokenizer, [r["question"] + " " + r["answer"] for r in rows], prompts)
    return {"c4-demo": c4, "gsm8k": gsm8k}


@pytest.mark.parametrize("name", ["c4-demo", "gsm8k"])
def test_bfd_rows_equal_trls_and_the_previous_ones(real, name):
    trl = pytest.importorskip("trl")
    columns = real[name]
    ds = datasets.Dataset.from_dict(columns)
    ours = pack_bfd(ds, MAX_LENGTH).to_dict()
    rows = [dict(zip(columns, r)) for r in zip(*columns.values())]
    assert [dict(zip(ours, r)) for r in zip(*ours.values())] == old.pack_bfd(rows, MAX_LENGTH)
    theirs = trl.pack_dataset(ds, MAX_LENGTH, "bfd", map_kwargs={"batch_size": len(ds)}).to_dict()
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["seq_lengths"] == theirs["seq_lengths"]
    if "labels" in columns:  # TRL moves labels as given; ours mask each document's first token
        for mine, given, lengths in zip(ours["labels"], theirs["labels"], theirs["seq_lengths"]):
            starts = np.cumsum([0] + lengths[:-1])
            expected = np.array(given)
            expected[starts] = -100
            assert mine == expected.tolist()


@pytest.mark.parametrize("name", ["c4-demo", "gsm8k"])
def test_wrapped_rows_equal_trls_and_the_previous_ones(real, name):
    trl = pytest.importorskip("trl")
    columns = real[name]
    ds = datasets.Dataset.from_dict(columns)
    ours = pack_wrapped(ds, MAX_LENGTH).to_dict()
    rows = [dict(zip(columns, r)) for r in zip(*columns.values())]
    assert [dict(zip(ours, r)) for r in zip(*ours.values())] == old.pack_wrapped(rows, MAX_LENGTH)
    theirs = trl.pack_dataset(ds, MAX_LENGTH, "wrapped", map_kwargs={"batch_size": len(ds)}).to_dict()
    assert {k: ours[k] for k in theirs} == theirs


def test_trls_default_map_batches_pack_each_thousand_documents_apart(real):
    """What the engine's opening comment says of ``trl.pack_dataset`` with ``SFTTrainer``'s default map
    batches: ``wrapped`` leaves a short row at the end of each 1,000 documents, ``bfd`` bins only within
    them."""
    trl = pytest.importorskip("trl")
    ds = datasets.Dataset.from_dict({"input_ids": real["gsm8k"]["input_ids"]})
    batches = -(-len(ds) // 1000)
    wrapped = trl.pack_dataset(ds, MAX_LENGTH, "wrapped")["input_ids"]
    assert sum(len(r) < MAX_LENGTH for r in wrapped) == batches == 8
    assert sum(len(r) < MAX_LENGTH for r in pack_wrapped(ds, MAX_LENGTH)["input_ids"]) == 1
    bfd = trl.pack_dataset(ds, MAX_LENGTH, "bfd")
    lengths = [len(x) for x in ds["input_ids"]]
    per_batch = sum(
        len(best_fit_decreasing(lengths[i : i + 1000], MAX_LENGTH)) for i in range(0, len(ds), 1000)
    )
    assert len(bfd) == per_batch > len(best_fit_decreasing(lengths, MAX_LENGTH))


def test_a_hundred_thousand_documents_of_gsm8k_lengths_pack_like_before(real):
    """Many equal lengths (ties) at scale: lengths drawn from GSM8K's, 10^5 documents, row for row."""
    rng = np.random.default_rng(0)
    pool = np.array([len(x) for x in real["gsm8k"]["input_ids"]])
    lengths = rng.choice(pool, 100_000).tolist()
    assert best_fit_decreasing(lengths, MAX_LENGTH) == old.best_fit_decreasing(lengths, MAX_LENGTH)
    tokens = rng.integers(0, 50_257, sum(lengths)).tolist()
    starts = np.cumsum([0] + lengths).tolist()
    rows = [{"input_ids": tokens[a:b]} for a, b in zip(starts, starts[1:])]
    ds = datasets.Dataset.from_list(rows)
    assert pack_bfd(ds, MAX_LENGTH).to_list() == old.pack_bfd(rows, MAX_LENGTH)
    assert pack_wrapped(ds, MAX_LENGTH).to_list() == old.pack_wrapped(rows, MAX_LENGTH)
