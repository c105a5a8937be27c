"""``data.num_proc``: tokenization through ``Dataset.map(num_proc=...)`` gives the same rows, in the same
order, with the same drop counts and report lines, as one process; bad values are refused naming the key;
streams say it does not apply; the tokenization rate is logged. GSM8K (shared data) tokenized with the GPT-2
tokenizer."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import datasets
import pytest

from hf_lightning import ConfigError, HFDataModule
from hf_lightning.config.hf_names import hf_name_error
from hf_lightning.data.tokenize import tokenize_dataset

ROWS = 600
MAX_LENGTH = 56  # GSM8K questions run from ~20 to ~150 GPT-2 tokens: some rows lose every completion token


def _gsm8k_jsonl(shared_data: str, folder: Path) -> Path:
    """The first ``ROWS`` GSM8K rows as ``prompt`` / ``completion`` (a file of its own: its own datasets
    cache)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "gsm8k.jsonl"
    with open(Path(shared_data) / "gsm8k" / "train.jsonl") as src, open(out, "w") as dst:
        for _, line in zip(range(ROWS), src):
            row = json.loads(line)
            dst.write(json.dumps({"prompt": row["question"], "completion": row["answer"]}) + "\n")
    return out


def _tokenize(path: Path, tokenizer, num_proc, caplog):
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        out = tokenize_dataset(
            ds, "prompt_completion", tokenizer, MAX_LENGTH, "train", path, num_proc=num_proc
        )
    return out, [r.getMessage() for r in caplog.records]


def _cut_rows(path: Path, tokenizer) -> list[int]:
    """By hand: the rows whose first ``MAX_LENGTH`` tokens all belong to the prompt's own tokenization
    (nothing of the completion survives truncation), as 1-based file lines."""
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)
        full = tokenizer(row["prompt"] + row["completion"])["input_ids"][:MAX_LENGTH]
        head = tokenizer(row["prompt"])["input_ids"][:MAX_LENGTH]
        if len(full) == MAX_LENGTH and full == head:
            lines.append(number)
    return lines


def test_two_processes_tokenize_gsm8k_exactly_as_one(shared_data, gpt2_tokenizer, tmp_path, caplog):
    one_path = _gsm8k_jsonl(shared_data, tmp_path / "one")
    two_path = tmp_path / "two" / "gsm8k.jsonl"
    two_path.parent.mkdir()
    shutil.copy(one_path, two_path)  # same rows, another file: no shared datasets cache between the two runs
    one, one_log = _tokenize(one_path, gpt2_tokenizer, None, caplog)
    two, two_log = _tokenize(two_path, gpt2_tokenizer, 2, caplog)
    assert len(two.cache_files) == 2  # really mapped by two processes (one cache shard each)
    assert one.column_names == two.column_names
    assert one.to_dict() == two.to_dict()  # every kept row, in the same order

    cut = _cut_rows(one_path, gpt2_tokenizer)
    assert 0 < len(cut) < ROWS // 2  # the case has drops, and they are not most rows
    assert len(two) == ROWS - len(cut)
    drop_lines = [m for m in two_log if "with no trained-on token" in m]
    assert len(drop_lines) == 1
    expected_lines = ", ".join(str(n) for n in cut[:5])
    assert f"train: dropped {len(cut)} of {ROWS} rows with no trained-on token: " in drop_lines[0]
    assert (
        f"truncation to data.max_length: {len(cut)} (data.path={two_path} lines {expected_lines}"
        in drop_lines[0]
    )
    # the same report, word for word, apart from the file's name
    assert [m.replace(str(two_path), "F") for m in two_log if "tokenized train" not in m] == [
        m.replace(str(one_path), "F") for m in one_log if "tokenized train" not in m
    ]

    rate = [m for m in two_log if m.startswith("tokenized train:")]
    assert len(rate) == 1
    tokens = sum(len(tokens) for tokens in two["input_ids"]) + sum(
        min(len(gpt2_tokenizer(json.loads(line)["prompt"])["input_ids"]), MAX_LENGTH)
        for n, line in enumerate(one_path.read_text().splitlines(), start=1)
        if n in cut
    )  # every tokenized row, the dropped ones too (each cut to MAX_LENGTH of its prompt's tokens)
    match = re.fullmatch(
        r"tokenized train: 600 rows, ([\d.,]+ ?k?) tokens in [\d.]+ s \([\d.,]+ k? ?rows/s, [\d.,]+ k? "
        r"?tokens/s\), num_proc=2",
        rate[0],
    )
    assert match, rate[0]
    shown = match.group(1)
    assert shown == (f"{tokens / 1e3:.3g} k" if tokens >= 1e4 else f"{tokens:,}")


@pytest.mark.slow
def test_a_second_run_says_the_rows_came_from_the_cache(shared_data, gpt2_tokenizer, tmp_path, caplog):
    path = _gsm8k_jsonl(shared_data, tmp_path)
    _tokenize(path, gpt2_tokenizer, 2, caplog)
    _, messages = _tokenize(path, gpt2_tokenizer, 2, caplog)
    rate = [m for m in messages if m.startswith("tokenized train:")]
    assert len(rate) == 1 and "read from the datasets cache" in rate[0], rate


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "data.num_proc=0: allowed values: null or an integer >= 1"),
        (-2, "data.num_proc=-2: allowed values: null or an integer >= 1"),
        (1.5, "data.num_proc=1.5: allowed values: null or an integer >= 1"),
        ("2", "data.num_proc='2': allowed values: null or an integer >= 1"),
        (True, "data.num_proc=true: allowed values: null or an integer >= 1"),
    ],
)
def test_a_bad_num_proc_is_refused_naming_the_key(word_tokenizer, value, message):
    with pytest.raises(ConfigError) as err:
        HFDataModule(word_tokenizer, path=None, num_proc=value)
    assert str(err.value) == message


@pytest.mark.parametrize("value", ["0", "two"])
def test_the_schema_refuses_a_bad_num_proc(compose_cfg, value):
    from hf_lightning.config.schema import validate_config

    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg(f"data.num_proc={value}"))
    assert (
        f"data.num_proc={value if value == '0' else repr(value)}: allowed values: null or an integer >= 1"
        in str(err.value)
    )


def test_trl_dataset_num_proc_gets_our_key():
    from hf_lightning.migrate import default_arguments
    from hf_lightning.migrate.fields import convert

    assert hf_name_error("dataset_num_proc", 4) == "dataset_num_proc is TRL's name: use data.num_proc=4"
    defaults = default_arguments("out")  # an SFTConfig dump: TrainingArguments' fields and TRL's
    overrides, dropped, _ = convert({**defaults, "dataset_num_proc": 4}, defaults)
    assert "data.num_proc=4" in overrides and not [d for d in dropped if d[0] == "dataset_num_proc"]


def test_a_stream_says_num_proc_does_not_apply(word_tokenizer, caplog):
    rows = datasets.Dataset.from_dict({"text": ["a b c", "d e f", "g h i"]}).to_iterable_dataset()
    dm = HFDataModule(word_tokenizer, path=rows, format="text", validation_split=0.0, num_proc=2)
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup()
    lines = [r.getMessage() for r in caplog.records if "data.num_proc" in r.getMessage()]
    assert lines == [
        "data.num_proc=2 does not apply to the train split: a stream is tokenized row by row, not with "
        "Dataset.map (data.num_workers spreads a stream's tokenization over DataLoader workers)"
    ]


def test_a_run_resumes_with_another_num_proc(tmp_path):
    from hf_lightning.run.folder import RunFolderGuard
    from tests.errors.test_config import compose_train, plant_run

    run_dir = tmp_path / "run"
    plant_run(run_dir)
    # the same tokenized rows with any number of processes: not a different run
    RunFolderGuard().on_run_start(
        compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "data.num_proc=2")
    )
