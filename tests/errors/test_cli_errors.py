"""The command line as a user meets a fault: one ``hf_lightning: error:`` line, exit status 2, no traceback,
and nothing already saved is lost. (Most cases are proven in-process in the other files; these show the
wiring.)"""

from __future__ import annotations

import json
import re

import pytest

from tests.errors.support import one_line_error, remount_read_only, run_train_cli, tiny_filesystem

pytestmark = pytest.mark.slow

CLM = [
    "+experiment=clm",
    "trainer.max_steps=3",
    "data.per_device_train_batch_size=2",
    "data.max_length=32",
    "model.config.hidden_size=32",
    "model.config.intermediate_size=64",
    "model.config.num_hidden_layers=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]


def write_text_rows(path, n=12, raw=None):
    lines = [
        json.dumps({"text": f"Line {i}: the quick brown fox jumps over the lazy dog."}) for i in range(n)
    ]
    for i, line in (raw or {}).items():
        lines[i] = line
    path.write_text("\n".join(lines) + "\n")
    return path


def test_broken_jsonl_line(tmp_path):
    data = write_text_rows(tmp_path / "data.jsonl", raw={8: '{"text": "unterminated'})
    proc = run_train_cli(*CLM, f"data.path={data}", f"hydra.run.dir={tmp_path / 'run'}")
    assert one_line_error(proc) == (
        f"hf_lightning: error: data.path={data}: could not be read as json: line 9 is not a JSON object "
        '(Unterminated string starting at: column 10): \'{"text": "unterminated\''
    )
    assert "ArrowInvalid" not in proc.stderr + proc.stdout  # datasets' reader logged it twice before ours


def test_an_empty_class_label_is_one_line(tmp_path):
    # before: TypeError: '<' not supported between instances of 'NoneType' and 'str', exit 1
    data = tmp_path / "train.csv"
    rows = "hello there,greeting\nwhat is my balance,\nhi again,greeting\n" * 2
    data.write_text("text,category\n" + rows)
    run = f"hydra.run.dir={tmp_path / 'run'}"
    proc = run_train_cli("+experiment=classification", f"data.path={data}", "data.validation_split=0", run)
    assert one_line_error(proc) == (
        f"hf_lightning: error: data.path={data} line 3 (train row 1): column 'category' is empty on this row "
        "(None); every row needs a class label: fill it in, or remove the row"
    )


def test_diverging_run_stops_before_a_nan_update(tmp_path):
    """The NonFiniteGuard is on by default: SGD at lr 1e30 overflows at step 2, which is never applied."""
    data = write_text_rows(tmp_path / "data.jsonl")
    run_dir = tmp_path / "run"
    proc = run_train_cli(
        *CLM,
        f"data.path={data}",
        f"hydra.run.dir={run_dir}",
        "optim.name=sgd",
        "optim.lr=1e30",
        "scheduler=constant",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        "data.validation_split=0",
    )
    line = one_line_error(proc)
    assert re.match(
        r"hf_lightning: error: optimizer step 2 \(epoch 0\): the (loss|gradient norm) is (nan|inf)", line
    ), line
    assert "so the update was not applied and training stopped; the weights are those after step 1" in line
    import torch

    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 1
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())


def test_fresh_run_refused_in_a_folder_holding_a_run(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"the previous run")
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("previous: config\n")
    data = write_text_rows(tmp_path / "data.jsonl")
    line = one_line_error(run_train_cli(*CLM, f"data.path={data}", f"hydra.run.dir={run_dir}"))
    assert line == (
        f"hf_lightning: error: hydra.run.dir={run_dir} already holds a run (checkpoints/last.ckpt); a fresh "
        "run there would overwrite it. Use a new hydra.run.dir, or ckpt_path=last to resume that run"
    )
    # refused before Hydra wrote anything: the previous run's config and checkpoint are as they were
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "previous: config\n"
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"the previous run"


def test_unwritable_run_folder(tmp_path):
    data = write_text_rows(tmp_path / "data.jsonl")
    with tiny_filesystem(tmp_path / "disk", "1m") as disk:
        remount_read_only(disk)
        line = one_line_error(run_train_cli(*CLM, f"data.path={data}", f"hydra.run.dir={disk}/run"))
    assert line == (
        f"hf_lightning: error: hydra.run.dir={disk}/run is not writable (Read-only file system): "
        "checkpoints, metrics and the exported model could not be saved; choose another hydra.run.dir"
    )
