"""The command line as a new user writes it: a ``lightning.Trainer`` argument the shipped YAML leaves out
needs no ``+`` (before: Hydra's ``Key 'overfit_batches' is not in struct``, exit 1), two experiments are one
line (before: Hydra's ``Multiple values for experiment``, exit 1, or the second one silently replacing the
first), and a mapping given whole is the mapping the run gets (before: merged into the experiment's entries).

The CLI is the thing under test: ``python -m hf_lightning.train`` in a subprocess, reading what it prints
(``--cfg job``), what it says and what it saves (``.hydra/config.yaml``, ``final_metrics.json``)."""

from __future__ import annotations

import json

import pytest
import yaml

from hf_lightning.config.typos import checked_command_line
from tests.errors.support import one_line_error, run_train_cli


def printed_config(*overrides: str) -> dict:
    proc = run_train_cli(*overrides, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load(proc.stdout)


# ------------------------------------------------------------------------ a Trainer argument not in the YAML
def test_a_trainer_argument_the_yaml_leaves_out_is_added_without_a_plus():
    args = ["+experiment=sft", "trainer.overfit_batches=2", "trainer.detect_anomaly=true"]
    assert checked_command_line(args, "train", "train") == [
        "+experiment=sft",
        "+trainer.overfit_batches=2",
        "+trainer.detect_anomaly=true",
    ]
    # in evaluate's command line too
    assert checked_command_line(["trainer.overfit_batches=2"], "evaluate", "evaluate") == [
        "+trainer.overfit_batches=2"
    ]
    # a sweep of one: each job gets it added
    swept = ["-m", "+experiment=sft", "trainer.overfit_batches=1,2"]
    assert checked_command_line(swept, "train", "train") == [
        "-m",
        "+experiment=sft",
        "+trainer.overfit_batches=1,2",
    ]
    trainer = printed_config(*args)["trainer"]
    assert (trainer["overfit_batches"], trainer["detect_anomaly"]) == (2, True)


def test_a_misspelt_trainer_argument_is_still_refused_naming_the_closest():
    line = one_line_error(run_train_cli("+experiment=sft", "trainer.overfit_batchez=2"))
    assert line.startswith(
        "hf_lightning: error: unknown config key trainer.overfit_batchez (did you mean "
        "trainer.overfit_batches?);"
    )


@pytest.mark.parametrize(
    "override,says",
    [
        (
            "trainer.accumulate_grad_batches=4",
            "trainer.accumulate_grad_batches=4: the accumulation window is data.gradient_accumulation_steps "
            "(HF's gradient_accumulation_steps): set data.gradient_accumulation_steps=4 instead",
        ),
        (
            "trainer.gradient_clip_val=0.5",
            "trainer.gradient_clip_val=0.5: clipping is module.max_grad_norm (HF's max_grad_norm, by norm): "
            "set module.max_grad_norm=0.5 instead (null: no clipping; unset: 1.0, HF's default)",
        ),
        (
            "trainer.gradient_clip_algorithm=value",
            "trainer.gradient_clip_algorithm='value': clipping is module.max_grad_norm, always by the "
            "gradients' total 2-norm (HF's max_grad_norm): remove the key",
        ),
        ("module.max_grad_norm=-1", "module.max_grad_norm=-1: allowed values: null or a number >= 0"),
        ("data.gradient_accumulation_steps=0", "data.gradient_accumulation_steps=0: allowed values:"),
    ],
)
def test_lightnings_accumulation_and_clipping_keys_are_refused_naming_hfs(tmp_path, override, says):
    """The module steps each accumulation window itself, so Lightning's accumulation and clipping cannot act
    (Lightning refuses them under manual optimization, with a traceback once ``fit`` has started): one line
    naming the key to set, exit 2, before any training."""
    run = tmp_path / "run"
    line = one_line_error(run_train_cli("+experiment=sft", override, f"hydra.run.dir={run}"))
    assert line.startswith("hf_lightning: error: " + says), line
    assert not (run / "checkpoints").exists()


@pytest.mark.slow
def test_trainer_overfit_batches_trains_on_that_many_batches_each_epoch(tmp_path):
    """8 rows, 2 held out, batch 2: 3 training batches an epoch; ``trainer.overfit_batches=2`` trains 2 each
    epoch, the same ones (no shuffling), validates on 2, and the per-row lines of this epoch-based run
    (``trainer.max_steps=-1``) count against the planned total: ``step 1 of 4`` (before: ``step 1``)."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"Sentence number {i} is here."}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={run}",
        "trainer.overfit_batches=2",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=1",
        "data.per_device_train_batch_size=2",
        "data.validation_split=0.25",
        "scheduler.warmup_steps=0",
        "trainer.enable_progress_bar=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "final_metrics.json").read_text())["global_step"] == 4  # 2 epochs x 2 batches
    saved = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["trainer"]
    assert (saved["overfit_batches"], saved["max_steps"]) == (2, -1)
    out = proc.stdout + proc.stderr
    assert (
        "trainer.overfit_batches=2: every epoch trains on the first 2 batches of the training data, the "
        "same ones in order (data.shuffle=false, as Lightning's overfit_batches turns shuffling off), and "
        "validates on the first 2 batches of the validation data"
    ) in out
    rows = [
        line.split(" - ", 1)[1].split(" [")[0]  # "step 1 of 4 [00:03<00:09]: ..."
        for line in out.splitlines()
        if "train_log][INFO] - step" in line
    ]
    assert rows == ["step 1 of 4", "step 2 of 4", "step 3 of 4", "step 4 of 4"]
    assert "done: 4 optimizer steps in " in out
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------- two experiments
@pytest.mark.parametrize(
    ("second", "said"),
    [
        ("+experiment=classification", "+experiment=classification"),
        ("experiment=classification", "experiment=classification"),  # before: classification, silently
        ("++experiment=classification", "++experiment=classification"),
    ],
)
def test_two_experiments_are_one_line_naming_both(second, said):
    line = one_line_error(run_train_cli("+experiment=sft", second))
    assert line == (
        f"hf_lightning: error: +experiment=sft and {said}: experiment is one choice, given twice; give one "
        "+experiment=NAME (the experiment options do not combine: each is a whole run)"
    )


def test_one_experiment_given_twice_or_swept_is_not_refused():
    assert checked_command_line(["+experiment=sft", "+experiment=sft"], "train", "train")
    assert checked_command_line(["-m", "+experiment=sft,clm"], "train", "train") == [
        "-m",
        "+experiment=sft,clm",
    ]


# ------------------------------------------------------------------------------- a mapping given whole
def test_a_mapping_given_whole_replaces_the_shipped_one():
    args = ["+experiment=classification", "data.rename_columns={text: sentence}"]
    assert checked_command_line(args, "train", "train") == [
        "+experiment=classification",
        "~data.rename_columns",
        "+data.rename_columns={text: sentence}",
    ]
    # before: {category: label, text: sentence}, the experiment's entry kept
    assert printed_config(*args)["data"]["rename_columns"] == {"text": "sentence"}
    # Hydra merges +KEY={...} and ++KEY={...} into the shipped entries too: the same replacement
    for plus in ("+", "++"):
        given = ["+experiment=classification", f"{plus}data.rename_columns={{text: sentence}}"]
        assert checked_command_line(given, "train", "train") == args[:1] + [
            "~data.rename_columns",
            "+data.rename_columns={text: sentence}",
        ]
        assert printed_config(*given)["data"]["rename_columns"] == {"text": "sentence"}
    # one entry by its dotted key: the shipped entries stay
    dotted = printed_config("+experiment=classification", "data.rename_columns.text=sentence")
    assert dotted["data"]["rename_columns"] == {"category": "label", "text": "sentence"}


@pytest.mark.slow
def test_the_run_gets_the_mapping_as_written(tmp_path):
    """A CSV whose columns are ``sentence, intent``: ``data.rename_columns={sentence: text, intent: label}``
    trains, and the run's saved config holds that mapping (before: merged with the experiment's
    ``category: label``, so the run was refused: ``data.rename_columns: ['category'] not in data.path``)."""
    data = tmp_path / "train.csv"
    rows = ["hello there,greeting", "what is my balance,balance", "hi again,greeting", "my balance,balance"]
    data.write_text("sentence,intent\n" + "\n".join(rows * 2) + "\n")
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=classification",
        f"data.path={data}",
        "data.rename_columns={sentence: text, intent: label}",
        "data.validation_split=0",
        "data.per_device_train_batch_size=4",
        "trainer.max_steps=1",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert saved["data"]["rename_columns"] == {"sentence": "text", "intent": "label"}
    assert json.loads((run / "final_metrics.json").read_text())["global_step"] == 1
