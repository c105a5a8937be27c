"""``+experiment=classification`` as a new user meets it: a file whose classes are not in ``category`` (the
experiment's rename) nor in ``label`` (the format's column) is one line that names the column to rename, the
line's fix runs, and the command line prunes the columns against the model it builds (no "no model to read
forward()" WARNING, which a DataModule with no model still gives)."""

from __future__ import annotations

import logging

import pytest

from hf_lightning import HFDataModule
from tests.errors.support import one_line_error, run_train_cli

ROWS = [
    ("my card has not arrived", "card_arrival"),
    ("top up failed", "top_up_failed"),
    ("where is my card", "card_arrival"),
    ("the top up did not work", "top_up_failed"),
]
NO_MODEL = "no model to read forward() from (none bound"
RUN = ["data.validation_split=0", "trainer.max_steps=1", "trainer.enable_model_summary=false"]


def write_intents(path, header="text,intent"):
    path.write_text(header + "\n" + "".join(f"{text},{label}\n" for text, label in ROWS))
    return path


@pytest.mark.slow
def test_a_file_with_its_classes_in_another_column_names_the_fix_and_the_fix_runs(tmp_path):
    # before: "data.rename_columns: ['category'] not in data.path=F (columns: ['text', 'intent'])", no fix;
    # with data.rename_columns=null, datasets' "Column name ['label'] not in the dataset" and a traceback
    data = write_intents(tmp_path / "intents.csv")
    proc = run_train_cli(
        "+experiment=classification", f"data.path={data}", *RUN, f"hydra.run.dir={tmp_path}/a"
    )
    assert one_line_error(proc) == (
        "hf_lightning: error: data.rename_columns renames 'category' to 'label', but "
        f"data.path={data} has no 'category' column (its columns: ['text', 'intent']; the classification "
        "format reads 'label'): drop the rename and rename the file's own column, e.g. "
        "'~data.rename_columns.category' data.rename_columns.intent=label"
    )
    unrenamed = run_train_cli(
        "+experiment=classification",
        f"data.path={data}",
        "data.rename_columns=null",
        *RUN,
        f"hydra.run.dir={tmp_path}/b",
    )
    assert one_line_error(unrenamed) == (
        f"hf_lightning: error: data.path={data}: format 'classification' needs a 'label' field; the train "
        "split has ['text', 'intent']; rename the file's columns to the format's, e.g. "
        "+data.rename_columns='{intent: label}'"
    )
    run_dir = tmp_path / "fixed"
    fixed = run_train_cli(
        "+experiment=classification",
        f"data.path={data}",
        "~data.rename_columns.category",  # the fix as the first line gives it
        "data.rename_columns.intent=label",
        *RUN,
        f"hydra.run.dir={run_dir}",
    )
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "done: 1 optimizer step in" in log
    # the command line binds the model it builds before the columns are pruned
    assert NO_MODEL not in log and NO_MODEL not in fixed.stderr


def test_the_builder_prunes_for_the_classifier_it_builds(compose_cfg, tmp_path, caplog):
    # before: the classes were read by a whole setup before the model existed, so the columns were pruned to
    # the tokenizer's names with a WARNING that no model was bound
    from hf_lightning.config.build import build

    data = write_intents(tmp_path / "b77.csv", "text,category")
    cfg = compose_cfg("+experiment=classification", f"data.path={data}", "data.validation_split=0")
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        run = build(cfg, "train")
    assert NO_MODEL not in caplog.text
    assert run.datamodule._columns.inputs_from == "BertForSequenceClassification.forward"
    assert run.model.config.id2label == {0: "card_arrival", 1: "top_up_failed"}
    assert sorted(run.datamodule.train_dataset.column_names) == [
        "attention_mask",
        "input_ids",
        "label",
        "token_type_ids",
    ]


def test_a_datamodule_with_no_model_still_says_so(default_tokenizer, tmp_path, caplog):
    data = write_intents(tmp_path / "b77.csv", "text,category")
    dm = HFDataModule(
        default_tokenizer, path=str(data), rename_columns={"category": "label"}, validation_split=0
    )
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm.setup("fit")
    assert [r.getMessage() for r in caplog.records if NO_MODEL in r.getMessage()] == [
        "no model to read forward() from (none bound: HFDataModule.bind(model), or a LightningModule with "
        "data_binding(); and data.model_input_names is not set): pruning columns to the tokenizer's "
        "model_input_names ['input_ids', 'attention_mask'] plus the label columns"
    ]
