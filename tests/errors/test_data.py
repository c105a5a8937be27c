"""Bad data: every case stops at setup with one message naming the file, the line or row, and the field.

Each test plants one fault in an otherwise good source and asserts the exact culprit in the message (the line
number, the value); warnings that count what was changed (truncation, dropped rows) are asserted by count.
"""

from __future__ import annotations

import json
import logging
import os
import re

import datasets
import pytest

from hf_lightning import DataError, HFDataModule
from hf_lightning.data import PaddingCollator
from tests.errors.support import CHAT_ROW, TEXT_ROWS, write_jsonl


def setup_dm(tokenizer, path, **kwargs):
    dm = HFDataModule(tokenizer=tokenizer, path=path, **{"validation_split": 0.0, **kwargs})
    dm.setup("fit")
    return dm


# ------------------------------------------------------------------------------------------ files
def test_missing_file(word_tokenizer, tmp_path):
    with pytest.raises(DataError, match=rf"^data.path={tmp_path}/absent.jsonl: no such file or folder$"):
        setup_dm(word_tokenizer, tmp_path / "absent.jsonl")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "locked.jsonl", TEXT_ROWS)
    path.chmod(0)
    with pytest.raises(DataError, match="the file exists but cannot be read \\(permissions\\)"):
        setup_dm(word_tokenizer, path)


def test_unsupported_file_type(word_tokenizer, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a b c\n")
    with pytest.raises(
        DataError, match=r"unsupported file type '\.txt'; expected one of \['\.csv', '\.json', '\.jsonl'"
    ):
        setup_dm(word_tokenizer, path)


def test_folder_not_written_by_save_to_disk(word_tokenizer, tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="a folder, but not one written by Dataset.save_to_disk"):
        setup_dm(word_tokenizer, tmp_path / "folder")


def test_broken_json_line_in_the_middle_is_named(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "broken.jsonl", TEXT_ROWS, raw={56: '{"text": "a b'})
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path)
    assert str(err.value) == (
        f"data.path={path}: could not be read as json: line 57 is not a JSON object "
        '(Unterminated string starting at: column 10): \'{"text": "a b\''
    )


def test_json_line_that_is_not_an_object(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "array.jsonl", TEXT_ROWS, raw={3: '["a b c"]'})
    with pytest.raises(DataError, match=r"line 4 is not a JSON object \(a JSON list, not an object\)"):
        setup_dm(word_tokenizer, path)


def test_row_of_the_wrong_type_in_the_middle_names_the_line(word_tokenizer, tmp_path):
    """datasets reads a column of mixed types as ``Json``; the bad value surfaces at tokenization. The message
    gives the file line even though the train split is a shuffled selection of the file's rows."""
    path = write_jsonl(tmp_path / "typed.jsonl", TEXT_ROWS, raw={56: json.dumps({"text": 123})})
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, validation_split=0.1)
    # row 56 of the file lands in one of the two shuffled splits; either way the file line is named
    assert re.fullmatch(
        rf"data.path={re.escape(str(path))} line 57 \((train|validation) row \d+\): field 'text' must be a "
        r"string, got int \(123\)",
        str(err.value),
    ), str(err.value)


def test_null_value_names_the_line_after_blank_lines(word_tokenizer, tmp_path):
    """Blank lines are not rows: the message still counts file lines."""
    path = tmp_path / "nulls.jsonl"
    lines = [json.dumps(r) for r in TEXT_ROWS[:10]]
    lines[7] = json.dumps({"text": None})
    path.write_text("\n\n".join(lines) + "\n")  # a blank line between rows: row 7 sits on line 15
    with pytest.raises(
        DataError, match=r"line 15 \(train row 7\): field 'text' must be a string, got NoneType"
    ):
        setup_dm(word_tokenizer, path)


@pytest.mark.parametrize("bad_line", [6, 10])
def test_non_utf8_jsonl_names_line_and_byte(word_tokenizer, tmp_path, bad_line):
    """pyarrow rejects some bad bytes when it reads the file and loads others that fail only when decoded (at
    tokenization): the message is the same either way."""
    raw = {bad_line - 1: json.dumps({"text": "café"}, ensure_ascii=False).encode("latin-1")}
    path = write_jsonl(tmp_path / "latin1.jsonl", TEXT_ROWS[:10], raw=raw)
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path)
    assert re.fullmatch(
        rf"data.path={re.escape(str(path))}( \(train\))?: line {bad_line} is not UTF-8 text \(byte 0xe9 at "
        r"column 14: '\{\"text\": \"caf\ufffd\"\}'\); re-encode the file as UTF-8, e.g. iconv -f latin1 -t "
        r"utf-8 latin1.jsonl",
        str(err.value),
    ), str(err.value)


def test_non_utf8_csv_names_line_and_byte(word_tokenizer, tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\na b,x\nc d,y\ncaf\u00e9 e,x\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"line 4 is not UTF-8 text \(byte 0xe9 at column 4"):
        setup_dm(word_tokenizer, path)


def test_ragged_csv_names_the_line(word_tokenizer, tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\na b,x\nc d,y,extra\n")
    with pytest.raises(DataError, match=r"could not be read as csv: .*Expected 2 fields in line 3, saw 3"):
        setup_dm(word_tokenizer, path)


def test_empty_file(word_tokenizer, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(
        DataError, match=rf"^data.path={path}: the file is empty \(0 bytes\): no rows to train on$"
    ):
        setup_dm(word_tokenizer, path)


@pytest.mark.parametrize(
    ("name", "content"), [("blank.jsonl", "\n\n"), ("header.csv", "text,label\n"), ("list.json", "[]")]
)
def test_file_without_rows(word_tokenizer, tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(
        DataError, match=r"the file holds no rows \(only a header, an empty list, or blank lines\)"
    ):
        setup_dm(word_tokenizer, path)


def test_empty_in_memory_dataset(word_tokenizer):
    with pytest.raises(DataError, match="the dataset is empty"):
        setup_dm(word_tokenizer, datasets.Dataset.from_dict({"text": []}))


def test_dataset_dict_without_train_split(word_tokenizer):
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_list(TEXT_ROWS[:4])})
    with pytest.raises(DataError, match=r"no 'train' split \(splits: \['test'\]\)"):
        setup_dm(word_tokenizer, dd)


def test_one_row_cannot_hold_out_validation(word_tokenizer):
    with pytest.raises(DataError, match="1 row, too few to hold out a validation split"):
        setup_dm(word_tokenizer, datasets.Dataset.from_list(TEXT_ROWS[:1]), validation_split=0.1)


# ------------------------------------------------------------------------------------------ fields
def test_wrong_field_names_for_the_format(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": "b"}] * 3)
    with pytest.raises(
        DataError,
        match=r"format 'messages' needs a 'messages' field; the train split has \['question', 'answer'\]",
    ):
        setup_dm(word_tokenizer, path, format="messages")


@pytest.mark.parametrize(
    ("rows", "fmt", "fix"),
    [
        # before: "no format fits these columns: rename them to a format's, e.g. ..., and set data.format=auto
        # (or the format they then fit)", naming neither the format the rename fits nor what messages hold
        (
            [{"question": "a", "answer": "b"}],
            "messages",
            "a 'messages' field holds a list of {role, content} turns (ShareGPT {from, value} turns: the "
            "conversations format); columns of prompt and reply text are the prompt_completion format: "
            "+data.rename_columns='{question: prompt, answer: completion}' data.format=prompt_completion",
        ),
        (
            [{"question": "a", "answer": "b"}],
            "text",
            "rename them to a format's, e.g. +data.rename_columns='{question: prompt, answer: completion}', "
            "and set data.format=prompt_completion",
        ),
        (
            [{"prompt": "a", "answer": "b"}],
            "prompt_completion",
            "rename the file's columns to the format's, e.g. +data.rename_columns='{answer: completion}'",
        ),
        (
            [{"id": 1, "sentence": "a b", "intent": "x"}, {"id": 2, "sentence": "c", "intent": "y"}],
            "classification",
            "rename the file's columns to the format's, e.g. +data.rename_columns='{sentence: text, intent: "
            "label}'",
        ),
        (
            [{"id": 1, "conversations": [{"from": "human", "value": "a"}]}],
            "messages",
            "these columns fit the format conversations: set data.format=conversations (or data.format=auto "
            "to detect it)",
        ),
    ],
)
def test_the_rename_hint_fits_the_format_asked_for(word_tokenizer, tmp_path, rows, fmt, fix):
    path = write_jsonl(tmp_path / "rows.jsonl", rows * 3)
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, format=fmt, validation_split=0)
    columns = list(rows[0])
    needs = [c for c in {"messages": ["messages"], "text": ["text"]}.get(fmt, []) if c not in columns]
    assert str(err.value).startswith(f"data.path={path}: format {fmt!r} needs ")
    assert str(err.value).endswith(f"; the train split has {columns}; {fix}")
    assert all(repr(c) in str(err.value) for c in needs)


@pytest.mark.parametrize(
    ("column", "turns", "fix"),
    [
        (
            "messages",
            [{"from": "human", "value": "a b"}, {"from": "gpt", "value": "c d"}],
            "each message needs 'role' and 'content', got {'from': 'human', 'value': 'a b'}: these are "
            "ShareGPT {from, value} turns, which the conversations format reads; rename the column: "
            "+data.rename_columns='{messages: conversations}' (with data.format=auto or conversations)",
        ),
        (
            "conversations",
            CHAT_ROW["messages"],
            "each ShareGPT turn needs 'from' and 'value', got {'role': 'user', 'content': 'a b'}: these are "
            "{role, content} turns, which the messages format reads; rename the column: "
            "+data.rename_columns='{conversations: messages}' (with data.format=auto or messages)",
        ),
    ],
)
def test_turns_of_the_other_chat_format_name_the_rename(word_tokenizer, tmp_path, column, turns, fix):
    # before: "each message needs 'role' and 'content', got {...}" alone
    path = write_jsonl(tmp_path / "chat.jsonl", [{column: turns}] * 3)
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, validation_split=0)
    assert str(err.value) == f"data.path={path} line 1 (train row 0): {fix}"
    other = "conversations" if column == "messages" else "messages"
    renamed = setup_dm(word_tokenizer, path, rename_columns={column: other}, validation_split=0)
    assert renamed.data_format == other  # the rename the message names reads the rows
    assert len(renamed.train_dataset) == 3


def test_format_cannot_be_detected(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": "b"}] * 3)
    with pytest.raises(
        DataError, match=r"cannot tell the data format from the columns \['question', 'answer'\]"
    ):
        setup_dm(word_tokenizer, path)


# ------------------------------------------------------------------------------------------ chat
def _chat(*roles):
    return {"messages": [{"role": r, "content": "a b"} for r in roles]}


def test_unknown_chat_role_names_the_line(word_tokenizer, tmp_path):
    rows = [CHAT_ROW] * 10
    path = write_jsonl(tmp_path / "chat.jsonl", rows, raw={7: json.dumps(_chat("user", "bot"))})
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path)
    assert str(err.value) == (
        f"data.path={path} line 8 (train row 7): unknown message role 'bot'; expected one of "
        "('system', 'user', 'assistant')"
    )


def test_system_message_out_of_order_names_the_line(word_tokenizer, tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl", [CHAT_ROW] * 5, raw={2: json.dumps(_chat("user", "system", "assistant"))}
    )
    with pytest.raises(
        DataError,
        match=r"line 3 \(train row 2\): a 'system' message must come first, found one at position 1",
    ):
        setup_dm(word_tokenizer, path)


def test_chat_template_that_refuses_the_role_order(tmp_path):
    """A template with ``raise_exception`` (as Llama-2/Mistral templates have) becomes a DataError with the
    line."""
    from tests.data_support import make_word_tokenizer

    tok = make_word_tokenizer()
    tok.chat_template = (
        "{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- "
        "endif %}{{- m['role'][0] + ' ' + m['content'] + ' <eos> ' }}{%- endfor %}"
    )
    path = write_jsonl(
        tmp_path / "chat.jsonl", [CHAT_ROW] * 6, raw={4: json.dumps(_chat("user", "user", "assistant"))}
    )
    with pytest.raises(DataError) as err:
        setup_dm(tok, path)
    assert str(err.value) == (
        f"data.path={path} line 5 (train row 4): the tokenizer's chat template refuses this conversation "
        "(roles: ['user', 'user', 'assistant']): Conversation roles must alternate "
        "user/assistant/user/assistant/..."
    )


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_reply(gpt2_tokenizer, tmp_path):
    """Qwen3's template (TRL's stored copy) drops the reasoning of replies before the last user message, so
    without ``{% generation %}`` markers the reply of message 1 is written one way as the last message and
    another in the whole conversation: refused with the line and the message, not trained on guessed
    tokens."""
    import copy
    from pathlib import Path

    import trl

    tok = copy.deepcopy(gpt2_tokenizer)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    thinking = _chat("user", "assistant", "user", "assistant")
    thinking["messages"][1]["content"] = "<think>\nThe user greets.\n</think>\n\nHello!"
    path = write_jsonl(tmp_path / "chat.jsonl", [CHAT_ROW] * 4, raw={2: json.dumps(thinking)})
    with pytest.raises(DataError) as err:
        setup_dm(tok, path)
    assert str(err.value) == (
        f"data.path={path} line 3 (train row 2): cannot tell which tokens are the reply of message 1 "
        "(assistant; messages counted from 0): the chat template writes the conversation up to it "
        "differently once the conversation goes on. Mark each assistant reply and its end-of-turn token with "
        "{% generation %}...{% endgeneration %} in the chat template (HF's return_assistant_tokens_mask "
        "reads them)"
    )


def test_a_python_tokenizer_that_joins_prompt_and_reply_is_refused_naming_the_reply(tmp_path):
    """Mistral's template writes the reply right after ``[/INST]``; CTRL's BPE (a Python tokenizer: no
    character offsets) writes the word ``[/INST]Hello`` with another last piece for ``]`` than ``[/INST]``
    alone, so no token boundary ends the prompt: refused, not trained on a guessed split."""
    import string

    from transformers import CTRLTokenizer

    from tests.chat_families import MISTRAL

    chars = sorted(set(string.printable) - set(string.whitespace))
    vocab = {"<unk>": 0, **{p: i + 1 for i, p in enumerate(p for c in chars for p in (c, c + "@@"))}}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tok = CTRLTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), pad_token="<unk>")
    tok.add_special_tokens({"eos_token": "</s>", "bos_token": "<s>"})
    tok.chat_template = MISTRAL
    assert not tok.is_fast
    path = write_jsonl(tmp_path / "chat.jsonl", [CHAT_ROW] * 3)
    with pytest.raises(DataError) as err:
        setup_dm(tok, path)
    assert str(err.value) == (
        f"data.path={path} line 1 (train row 0): cannot tell which tokens are the reply of message 1 "
        "(assistant; messages counted from 0): this tokenizer writes one token across an end of the reply "
        "and gives no character offsets (a Python tokenizer) to tell which tokens it covers. Mark each "
        "assistant reply and its end-of-turn token with {% generation %}...{% endgeneration %} in the chat "
        "template (HF's return_assistant_tokens_mask reads them)"
    )


def test_malformed_messages_field(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [CHAT_ROW] * 4, raw={1: json.dumps({"messages": "hello"})})
    with pytest.raises(DataError, match=r"line 2 \(train row 1\): field 'messages' must be a non-empty list"):
        setup_dm(word_tokenizer, path)


def test_unknown_sharegpt_speaker(word_tokenizer, tmp_path):
    good = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}
    bad = {"conversations": [{"from": "human", "value": "a"}, {"from": "robot", "value": "b"}]}
    path = write_jsonl(tmp_path / "sharegpt.jsonl", [good, good, bad])
    with pytest.raises(DataError, match=r"line 3 \(train row 2\): unknown ShareGPT speaker 'robot'"):
        setup_dm(word_tokenizer, path)


# ------------------------------------------------------------------------------------------ targets and
# lengths
def test_every_row_loses_its_targets_to_truncation(word_tokenizer, tmp_path):
    rows = [{"prompt": "a b c d e f", "completion": " g"}] * 5
    path = write_jsonl(tmp_path / "pc.jsonl", rows)
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, max_length=4)
    assert str(err.value) == (
        f"data.path={path}: the train split is empty after tokenization: 5 rows were read and none has a "
        f"trained-on token [all labels -100 after truncation to data.max_length: 5 (data.path={path} lines "
        "1, 2, 3, 4, 5)]: raise data.max_length (now 4)"
    )


def test_rows_without_targets_are_dropped_and_counted(word_tokenizer, tmp_path, caplog):
    rows = [{"prompt": "a b c d e f", "completion": " g"}] * 3 + [{"prompt": "a", "completion": " b"}] * 2
    path = write_jsonl(tmp_path / "pc.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = setup_dm(word_tokenizer, path, max_length=4)
    assert len(dm.train_dataset) == 2
    assert (
        "train: dropped 3 of 5 rows with no trained-on token: all labels -100 after truncation to "
        f"data.max_length: 3 (data.path={path} lines 1, 2, 3)"
    ) in caplog.text


def test_sequences_longer_than_max_length_are_counted(word_tokenizer, tmp_path, caplog):
    rows = [{"text": "a b c d e f g h"}] * 3 + [{"text": "a b"}] * 4
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = setup_dm(word_tokenizer, path, max_length=5)
    # 3 rows x (8 - 5) tokens
    assert (
        "train: 3 of 7 rows were longer than data.max_length=5 and were truncated (9 tokens cut off); "
        "data.packing=wrapped keeps every token"
    ) in caplog.text
    assert max(len(x) for x in dm.train_dataset["input_ids"]) == 5


def test_classification_label_not_in_the_training_labels(word_tokenizer, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "a b", "label": c} for c in "xyxy"])
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": "a b", "label": c} for c in "xyz"])
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, train, validation_path=val)
    assert (
        str(err.value)
        == f"data.path={val} line 3 (validation row 2): column 'label' holds 'z', which is not one of the 2 "
        "training labels ['x', 'y']"
    )


def test_tokenized_labels_of_another_length(word_tokenizer, tmp_path):
    rows = [{"input_ids": [4, 5, 6], "labels": [4, 5, 6]}] * 3 + [{"input_ids": [4, 5, 6], "labels": [4, 5]}]
    path = write_jsonl(tmp_path / "tok.jsonl", rows)
    with pytest.raises(
        DataError, match=r"line 4 \(train row 3\): field 'labels' has 2 positions but 'input_ids' has 3"
    ):
        setup_dm(word_tokenizer, path)


def test_token_row_that_is_not_integers():
    collate = PaddingCollator(pad_token_id=0)
    with pytest.raises(DataError, match=r"a token row must be a list of integer ids, got \['a', 'b'\]"):
        collate([{"input_ids": [1, 2]}, {"input_ids": ["a", "b"]}])


def test_dataset_smaller_than_one_batch_with_drop_last(word_tokenizer, tmp_path):
    """Without the check, Lightning 'trains' zero steps and reports success."""
    path = write_jsonl(tmp_path / "small.jsonl", TEXT_ROWS[:3])
    dm = setup_dm(word_tokenizer, path, drop_last=True, per_device_train_batch_size=8)
    with pytest.raises(DataError) as err:
        dm.train_dataloader()
    assert str(err.value) == (
        "the train split gives each rank 3 examples, fewer than one batch of "
        "data.per_device_train_batch_size=8, and data.drop_last=true drops that partial batch: no training "
        "step would run. Lower the batch size or set data.drop_last=false"
    )


def test_stream_smaller_than_one_batch_with_drop_last(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "small.jsonl", TEXT_ROWS[:3])
    dm = setup_dm(
        word_tokenizer, datasets.load_from_disk(_saved(path, tmp_path)), streaming=True, drop_last=True
    )
    with pytest.raises(DataError, match="gives each rank 3 examples, fewer than one batch"):
        dm.train_dataloader()


def _saved(jsonl, tmp_path):
    folder = tmp_path / "saved"
    datasets.load_dataset("json", data_files=str(jsonl), split="train").save_to_disk(str(folder))
    return str(folder)


# ------------------------------------------------------------------------------------------ streams
def read_stream(tokenizer, path, **kwargs):
    dm = setup_dm(tokenizer, path, streaming=True, **kwargs)
    return [b for b in dm.train_dataloader()]


def test_stream_with_a_broken_line(word_tokenizer, tmp_path):
    """A stream reads its file lazily: the parser error shows at setup (first row) or mid-epoch, named the
    same."""
    path = write_jsonl(tmp_path / "broken.jsonl", TEXT_ROWS, raw={56: '{"text": "a b'})
    with pytest.raises(
        DataError, match=r"could not be read as json: line 57 is not a JSON object \(Unterminated string"
    ):
        read_stream(word_tokenizer, path)


def test_unshuffled_stream_names_the_line_of_a_bad_row(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "typed.jsonl", TEXT_ROWS, raw={56: json.dumps({"text": 5})})
    with pytest.raises(DataError) as err:
        read_stream(word_tokenizer, path, shuffle=False)
    assert (
        str(err.value)
        == f"data.path={path} line 57 (train stream row 56): field 'text' must be a string, got int (5)"
    )


def test_shuffled_stream_names_the_value_and_its_position(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "typed.jsonl", TEXT_ROWS, raw={56: json.dumps({"text": 5})})
    with pytest.raises(
        DataError,
        match=r"\(train stream row \d+, in this epoch's shuffled order\): field 'text' must be a string, got "
        r"int \(5\)",
    ):
        read_stream(word_tokenizer, path)


def test_non_utf8_stream(word_tokenizer, tmp_path):
    raw = {50: json.dumps({"text": "café"}, ensure_ascii=False).encode("latin-1")}
    path = write_jsonl(tmp_path / "latin1.jsonl", TEXT_ROWS, raw=raw)
    with pytest.raises(DataError, match=r"line 51 is not UTF-8 text \(byte 0xe9 at column 14"):
        read_stream(word_tokenizer, path)
