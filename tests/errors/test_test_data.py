"""``data.test_path`` given to the train command is checked before training: a missing file, a file type
``datasets`` cannot read, or columns that fit no format (or not the training split's) stop it in one line
naming ``data.test_path``, before a step is trained or a checkpoint written."""

from __future__ import annotations

import json

import pytest

from hf_lightning import DataError, HFDataModule, HFLightningModule
from hf_lightning.run.test_stage import prepare_test_data
from tests.data_support import tiny_llama
from tests.errors.support import one_line_error, run_train_cli

TRAIN = [{"text": f"a b c {'defgh'[i % 5]}"} for i in range(12)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bad_sources(tmp_path):
    text = tmp_path / "test.txt"
    text.write_text("a b c\nd e f\n")
    return {
        "missing": (tmp_path / "nope.jsonl", "no such file or folder"),
        "txt": (
            text,
            "unsupported file type '.txt'; expected one of ['.csv', '.json', '.jsonl', '.parquet'] or a "
            "folder written by Dataset.save_to_disk",
        ),
        "columns": (
            write_jsonl(tmp_path / "other.jsonl", [{"question": "a b", "answer": "c"}]),
            "format 'text' needs a 'text' field; the test split has ['question', 'answer']; rename them to a "
            "format's, e.g. +data.rename_columns='{question: prompt, answer: completion}', and set "
            "data.format=prompt_completion",
        ),
    }


@pytest.mark.parametrize("case", ["missing", "txt", "columns"])
def test_a_bad_test_source_is_refused_before_fit(tmp_path, word_tokenizer, case):
    path, reason = bad_sources(tmp_path)[case]
    dm = HFDataModule(
        word_tokenizer, path=write_jsonl(tmp_path / "train.jsonl", TRAIN), test_path=str(path), max_length=16
    )
    module = HFLightningModule(tiny_llama(len(word_tokenizer)))
    with pytest.raises(DataError) as err:
        prepare_test_data(dm, module)
    assert str(err.value) == f"data.test_path={path}: {reason}"


def test_a_split_that_is_not_there_is_refused_before_fit(tmp_path, word_tokenizer):
    dm = HFDataModule(
        word_tokenizer,
        path=write_jsonl(tmp_path / "train.jsonl", TRAIN),
        test_split_name="test",
        max_length=16,
    )
    with pytest.raises(DataError, match=r"data.test_split_name=test: data.path=.* has no splits"):
        prepare_test_data(dm, HFLightningModule(tiny_llama(len(word_tokenizer))))


def test_without_test_keys_nothing_is_read(tmp_path, word_tokenizer):
    dm = HFDataModule(word_tokenizer, path=str(tmp_path / "never-read.jsonl"))
    assert prepare_test_data(dm, HFLightningModule(tiny_llama(len(word_tokenizer)))) is False
    assert dm.train_dataset is None and dm.test_dataset is None


@pytest.mark.slow
def test_the_train_command_stops_before_training(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    missing = tmp_path / "test.jsonl"
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={train}",
        f"data.test_path={missing}",
        "model.config.hidden_size=32",
        "model.config.intermediate_size=64",
        "model.config.num_hidden_layers=1",
        "trainer.max_steps=2",
        f"hydra.run.dir={run}",
    )
    assert one_line_error(proc) == f"hf_lightning: error: data.test_path={missing}: no such file or folder"
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    assert not (run / "metrics.csv").exists() and not (run / "hf_model").exists()
