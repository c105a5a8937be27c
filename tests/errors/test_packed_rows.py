"""Pre-tokenized rows that carry their documents (``seq_lengths``, as ``trl.pack_dataset`` writes it, or
``position_ids`` restarting at 0) are checked row by row before training, the bad row named by its line; and
such rows are not packed again."""

from __future__ import annotations

import json

import pytest

from hf_lightning import ConfigError, DataError, HFDataModule

ROWS = [
    {"input_ids": [4, 5, 6, 7, 8], "seq_lengths": [3, 2]},
    {"input_ids": [9, 10, 11], "seq_lengths": [3]},
    {"input_ids": [12, 13, 14, 15, 16], "seq_lengths": [3, 2]},
    {"input_ids": [17, 18], "seq_lengths": [1, 1]},
]


def setup(tmp_path, word_tokenizer, line, value, key="seq_lengths", **kwargs):
    """``ROWS`` in a JSON Lines file with line ``line`` (1-based) holding ``key: value``."""
    rows = [dict(r) for r in ROWS]
    rows[line - 1][key] = value
    path = tmp_path / "packed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    HFDataModule(word_tokenizer, path=str(path), validation_split=0.0, max_length=8, **kwargs).setup("fit")
    return path


@pytest.mark.parametrize(
    "value, reason",
    [
        (
            [3, 3],
            "field 'seq_lengths' holds [3, 3], which add up to 6 tokens, but the row has 5 input_ids; they "
            "are the lengths of the row's documents, in order (trl.pack_dataset's column), and must add up "
            "to its input_ids",
        ),
        (
            [6, -1],
            "field 'seq_lengths' holds -1 in [6, -1]: the lengths of the row's documents are whole "
            "numbers >= 0",
        ),
    ],
    ids=["do_not_add_up", "negative"],
)
def test_seq_lengths_that_do_not_fit_the_row_are_refused_naming_its_line(
    tmp_path, word_tokenizer, value, reason
):
    with pytest.raises(DataError) as err:
        setup(tmp_path, word_tokenizer, 3, value)
    assert str(err.value) == f"data.path={tmp_path / 'packed.jsonl'} line 3 (train row 2): {reason}"


def test_position_ids_that_do_not_count_up_are_refused_naming_its_line(tmp_path, word_tokenizer):
    rows = [{"input_ids": r["input_ids"], "position_ids": list(range(len(r["input_ids"])))} for r in ROWS]
    rows[1]["position_ids"] = [0, 2, 3]
    path = tmp_path / "positions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=str(path), validation_split=0.0).setup("fit")
    assert str(err.value) == (
        f"data.path={path} line 2 (train row 1): field 'position_ids' holds 2 at position 1 (after 0): a "
        "row's positions start at 0 at each document's first token and count up by 1 within it"
    )


def test_packed_rows_are_not_packed_again(tmp_path, word_tokenizer):
    path = tmp_path / "packed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(ConfigError) as err:
        HFDataModule(word_tokenizer, path=str(path), validation_split=0.0, packing="bfd").setup("fit")
    assert str(err.value) == (
        f"data.packing=bfd: the rows of data.path={path} hold several documents each (their 'seq_lengths' "
        "column, as trl.pack_dataset writes it), so they are packed already, and packing them again would "
        "lose where their documents start; set data.packing=false"
    )


@pytest.mark.parametrize(
    "row, reason",
    [
        (
            {"input_ids": [9, 10, 11], "seq_lengths": [2, 1], "position_ids": [0, 1, 2]},
            "fields 'seq_lengths' and 'position_ids' disagree: the lengths start documents at [0, 2], the "
            "positions restart at 0 at [0]",
        ),
        (
            {"input_ids": [9, 10, 11], "seq_lengths": None},
            "field 'seq_lengths' is missing on this row while other rows have it; give every row the lengths "
            "of its documents (one document: [len(input_ids)])",
        ),
        (
            {"input_ids": [9, 10, 0], "seq_lengths": [2, 1], "attention_mask": [1, 1, 0]},
            "field 'attention_mask' has zeros in a row whose documents are given by 'seq_lengths' / "
            "'position_ids': such a row holds documents side by side and no padding; remove the padding "
            "positions from its columns",
        ),
    ],
    ids=["disagree", "missing", "padding"],
)
def test_documents_that_do_not_describe_the_row_are_refused(tmp_path, word_tokenizer, row, reason):
    rows = [{**ROWS[0], **{k: [1] * 5 for k in row if k == "attention_mask"}}, row]
    rows[0].update({"position_ids": [0, 1, 2, 0, 1]} if "position_ids" in row else {})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=str(path), validation_split=0.0).setup("fit")
    assert str(err.value) == f"data.path={path} line 2 (train row 1): {reason}"


def test_a_model_that_cannot_keep_the_documents_apart_is_refused(tmp_path, word_tokenizer):
    from hf_lightning import HFLightningModule
    from tests.unit.test_layout import NoPositions

    path = tmp_path / "packed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    dm = HFDataModule(word_tokenizer, path=str(path), validation_split=0.0)
    dm.bind(**HFLightningModule(NoPositions()).data_binding())
    with pytest.raises(ConfigError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        f"the rows of data.path={path} hold several documents each (their 'seq_lengths' column, as "
        "trl.pack_dataset writes it), and they cannot be kept apart: NoPositions.forward takes no "
        "position_ids, so it cannot keep the documents of one row apart; use a model whose attention keeps "
        "them apart (a Llama-style causal LM under sdpa, eager or flash attention), or give one document per "
        "row"
    )
