"""Classification labels: a bad label is named by its column (as the file names it), its value and its
line.

Each file is an otherwise good ``text,category`` CSV or JSON Lines file run through
``+experiment=classification`` (whose ``data.rename_columns`` reads ``category`` as ``label``) or through
``HFDataModule`` directly; the lines in the expected messages are counted by hand (a CSV's header is line 1).
The ids of good labels come from ``datasets``' own ``class_encode_column`` (HF's ``ClassLabel``), run beside.
"""

from __future__ import annotations

import json

import datasets
import pytest

from hf_lightning import ConfigError, DataError, HFDataModule

GOOD = [("hello there", "greeting"), ("what is my balance", "balance"), ("hi again", "greeting")] * 3


def write_csv(path, rows, header="text,category"):
    lines = [header] + [f"{text},{'' if label is None else label}" for text, label in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path, rows, column="category"):
    path.write_text("".join(json.dumps({"text": t, column: label}) + "\n" for t, label in rows))
    return path


def build_classification(compose_cfg, *overrides):
    from hf_lightning.config.build import build

    cfg = compose_cfg("+experiment=classification", "data.validation_split=0", *overrides)
    return build(cfg, "train")


# ------------------------------------------------------------------------ through +experiment=classification
def test_an_empty_label_cell_is_named_by_column_and_line(compose_cfg, tmp_path):
    # before: TypeError: '<' not supported between instances of 'NoneType' and 'str' (from label_mapping)
    rows = [*GOOD[:4], ("how are you", None), *GOOD[4:]]
    path = write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(DataError) as err:
        build_classification(compose_cfg, f"data.path={path}")
    assert str(err.value) == (
        f"data.path={path} line 6 (train row 4): column 'category' is empty on this row (None); every row "
        "needs a class label: fill it in, or remove the row"
    )


def test_an_empty_cell_in_a_column_of_integers_is_named_too(word_tokenizer, tmp_path):
    # pandas reads an integer column with a missing cell as floats with NaN; datasets makes that a null
    path = write_csv(tmp_path / "train.csv", [("a b", 0), ("c", 1), ("d e", None), ("f", 1)], "text,label")
    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=path, validation_split=0.0).setup()
    assert str(err.value) == (
        f"data.path={path} line 4 (train row 2): column 'label' is empty on this row (None); every row needs "
        "a class label: fill it in, or remove the row"
    )


def test_float_labels_are_named_as_regression_targets(compose_cfg, tmp_path):
    # before: "model.task=sequence_classification needs model.num_labels", naming neither column nor value
    rows = [("hello there", 0.5), ("what is my balance", 1.5), ("hi again", 2.0), ("bye", 0.5)]
    path = write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(DataError) as err:
        build_classification(compose_cfg, f"data.path={path}", "data.shuffle=false")
    assert str(err.value) == (
        f"data.path={path} line 2 (train row 0): column 'category' holds 0.5, a float: float labels are "
        "regression targets, not classes, and the command line trains and evaluates classifiers "
        "(cross-entropy, accuracy and F1 over classes). Write the classes as class names or integer class "
        "ids (HFDataModule batches float labels as float32 for a LightningModule of your own that does "
        "regression)"
    )


def test_integer_ids_without_num_labels_name_the_largest_id(compose_cfg, tmp_path):
    # the sibling of the float case: the same bare "needs model.num_labels" line before
    path = write_csv(tmp_path / "train.csv", [("a", 0), ("b", 4), ("c", 1)])
    with pytest.raises(DataError) as err:
        build_classification(compose_cfg, f"data.path={path}")
    assert str(err.value) == (
        f"data.path={path} line 2 (train row 0): column 'category' holds 0, an integer class id: integer "
        "labels do not say how many classes there are; set model.num_labels=5 or more (the largest id, 4, "
        "is on line 3)"
    )


def test_names_mixed_with_numbers_name_the_odd_one_and_its_line(compose_cfg, tmp_path):
    # before: "label 'x' is not one of the training labels []"
    rows = [("hello there", 0), ("what is my balance", 1), ("hi again", "x"), ("bye", 1)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as err:
        build_classification(compose_cfg, f"data.path={path}")
    assert str(err.value) == (
        f"data.path={path} line 3 (train row 2): column 'category' holds 'x', a class name, while line 1 "
        "holds 0, an integer class id (3 of the 4 labels are of that kind): write every label of the column "
        "the same way, as class names or as integer class ids"
    )


def test_a_label_name_that_is_no_column_or_batch_key_is_refused(compose_cfg, tmp_path):
    # before: data.label_names=[nope] trained on 'label' without a word
    path = write_csv(tmp_path / "train.csv", GOOD)
    with pytest.raises(ConfigError) as err:
        build_classification(compose_cfg, f"data.path={path}", "data.label_names=[nope]")
    assert str(err.value) == (
        "data.label_names=['nope']: 'nope' is neither a key of the batches (['attention_mask', 'input_ids', "
        f"'labels', 'token_type_ids']) nor a column of data.path={path} (columns after data.rename_columns: "
        "['label', 'text']). data.label_names names the batch keys that hold the labels (HF label_names); "
        "the classification format reads its labels from the 'label' column and batches them as 'labels': "
        "leave data.label_names unset, or name keys the batches have"
    )


def test_label_names_that_the_batches_hold_still_build(compose_cfg, tmp_path):
    path = write_csv(tmp_path / "train.csv", GOOD)
    run = build_classification(compose_cfg, f"data.path={path}", "data.label_names=[labels]")
    assert run.datamodule.resolved_label_names == ["labels"]


# ---------------------------------------------------------------------------- validation against training
def test_validation_labels_of_another_kind_are_named(word_tokenizer, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [("a b", 0), ("c", 1), ("d", 1)], column="label")
    val = write_jsonl(tmp_path / "val.jsonl", [("a b", 0), ("c", "one")], column="label")
    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=train, validation_path=val).setup()
    assert str(err.value) == (
        f"data.path={val} line 2 (validation row 1): column 'label' holds 'one', a class name, but the "
        f"training labels are integer class ids (data.path={train} line 1 (train row 0): column 'label' "
        "holds 0); write this split's labels the same way"
    )


def test_validation_numbers_against_training_names_are_named(word_tokenizer, tmp_path):
    # before: the integers went through as class ids of a mapping they were never part of
    train = write_jsonl(tmp_path / "train.jsonl", [("a b", "x"), ("c", "y")], column="label")
    val = write_jsonl(tmp_path / "val.jsonl", [("a b", "x"), ("c", 1)], column="label")
    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=train, validation_path=val).setup()
    assert str(err.value) == (
        f"data.path={val} line 2 (validation row 1): column 'label' holds 1, an integer class id, but the "
        "training labels are the class names ['x', 'y']; write this split's labels the same way"
    )


def test_string_ids_match_datasets_class_encode_column(word_tokenizer, tmp_path):
    rows = [("a b", "spam"), ("c", "ham"), ("d e", "eggs"), ("f", "spam")]
    path = write_csv(tmp_path / "train.csv", rows, "text,label")
    dm = HFDataModule(word_tokenizer, path=path, validation_split=0.0, shuffle=False)
    dm.setup()
    oracle = datasets.Dataset.from_dict({"label": [r[1] for r in rows]}).class_encode_column("label")
    assert dm.id2label == dict(enumerate(oracle.features["label"].names))
    assert dm.train_dataset["label"] == oracle["label"]


def test_a_validation_class_label_is_mapped_by_its_names(word_tokenizer):
    # the validation ClassLabel orders the names differently: its ids alone would swap the classes
    train_feature = datasets.ClassLabel(names=["neg", "pos"])
    val_feature = datasets.ClassLabel(names=["pos", "neg"])
    features = lambda f: datasets.Features({"text": datasets.Value("string"), "label": f})  # noqa: E731
    train = datasets.Dataset.from_dict(
        {"text": ["a", "b"], "label": [0, 1]}, features=features(train_feature)
    )
    val = datasets.Dataset.from_dict(
        {"text": ["c", "d", "e"], "label": [0, 0, 1]}, features=features(val_feature)
    )
    dm = HFDataModule(word_tokenizer, path=train, validation_path=val, shuffle=False)
    dm.setup()
    by_hand = [train_feature.str2int(val_feature.int2str(i)) for i in [0, 0, 1]]  # pos, pos, neg
    assert dm.val_dataset["label"] == by_hand == [1, 1, 0]


def test_float_labels_need_a_one_output_model_when_one_is_bound(word_tokenizer, tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    path = write_csv(tmp_path / "train.csv", [("a b", 0.25), ("c", 1.5)], "text,label")
    cfg = dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    two = BertForSequenceClassification(BertConfig(**cfg, num_labels=2))
    dm = HFDataModule(word_tokenizer, path=path, validation_split=0.0, shuffle=False)
    dm.bind(two)
    with pytest.raises(DataError) as err:
        dm.setup()
    assert str(err.value) == (
        f"data.path={path} line 2 (train row 0): column 'label' holds 0.25, a float: float labels are "
        "regression targets, not classes, so the model needs one output (config.num_labels=1; it has 2); "
        "build it with num_labels=1, or write the classes as class names or integer class ids"
    )
    one = HFDataModule(word_tokenizer, path=path, validation_split=0.0, shuffle=False)
    one.bind(BertForSequenceClassification(BertConfig(**cfg, num_labels=1)))
    one.setup()
    assert one.train_dataset["label"] == [0.25, 1.5]
