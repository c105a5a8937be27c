"""A full disk or a read-only remount at each kind of write of a run: one line, exit status 2, and every file
written before it intact.

The run folder lies on a real tmpfs (mounted here as root; every test is skipped, with the mount's reason,
where that is not permitted). :class:`tests.disk_points.DiskFault` fills it, or remounts it read-only, just
before one write: a checkpoint, a ``metrics.csv`` row, the weights or the tokenizer of ``hf_model/``,
``final_metrics.json``; or the disk is full before the run starts. Checked after the failure: the one
``hf_lightning: error:`` line names the file and the reason; every checkpoint left passes its checksum and
loads; ``metrics.csv`` is the straight run's first rows, whole; no temporary file is left; ``hf_model/`` is
absent or complete.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess

import pytest
import torch

from hf_lightning.checkpointing.io import checksum_problem
from tests.errors.support import one_line_error, run_train_cli, tiny_filesystem

pytestmark = pytest.mark.slow

RUN = (
    "+experiment=clm",
    "trainer.max_steps=4",
    "trainer.max_epochs=null",
    "trainer.log_every_n_steps=2",
    "callbacks.model_checkpoint.every_n_train_steps=2",
    "trainer.limit_val_batches=1",
    "trainer.val_check_interval=null",
    "data.per_device_train_batch_size=4",
    "data.per_device_eval_batch_size=4",
    "data.max_length=32",
    "data.validation_split=0.1",
    "trainer.enable_progress_bar=false",
    "model.config.hidden_size=64",
    "model.config.intermediate_size=128",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=2",
    "model.config.num_key_value_heads=2",
)
# (write, step, what the line names, the file it names relative to the run folder)
CASES = [
    ("checkpoint", 4, "checkpoint", "checkpoints/step000004.ckpt"),
    ("metrics_row", 4, "the metrics log", "metrics.csv"),
    ("export_weights", 0, "the exported model", "hf_model"),
    ("export_tokenizer", 0, "the exported model", "hf_model"),
    ("final_metrics", 0, "the final metrics", "final_metrics.json"),
]
REASON = {"full": "No space left on device (ENOSPC)", "read_only": "Read-only file system (EROFS)"}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = random.Random(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    path = tmp_path_factory.mktemp("data") / "lines.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(3, 30)))}) + "\n" for _ in range(40)
        )
    )
    return path


@pytest.fixture(scope="module")
def straight_rows(text_file, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    proc = run_train_cli(*RUN, f"data.path={text_file}", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return rows(run)


def rows(run) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return [
            {k: v for k, v in r.items() if v and not k.endswith(("_per_s", "/mfu"))}
            for r in csv.DictReader(fh)
        ]


def assert_intact(run, straight_rows, read_only: bool = False) -> None:
    """Every checkpoint verifies and loads, the log is a whole prefix of the straight run's, no temp file is
    left (on a read-only filesystem, the export's temporary folder cannot be removed: the next start removes
    it), and ``hf_model/`` is absent or complete."""
    names = os.listdir(run / "checkpoints") if (run / "checkpoints").is_dir() else []
    for name in names:
        if name.endswith(".ckpt"):
            assert checksum_problem(str(run / "checkpoints" / name)) is None, name
            assert "state_dict" in torch.load(
                run / "checkpoints" / name, weights_only=False, map_location="cpu"
            )
    if (run / "metrics.csv").exists():
        got = rows(run)
        assert got == straight_rows[: len(got)]
    temps = [n for root, dirs, files in os.walk(run) for n in dirs + files if n.startswith(".tmp-")]
    assert [n for n in temps if not (read_only and n.startswith(".tmp-hf_model."))] == []
    if (run / "hf_model").exists():
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(run / "hf_model"))


@pytest.mark.parametrize("mode", ["full", "read_only"])
@pytest.mark.parametrize(("write", "step", "what", "target"), CASES, ids=[c[0] for c in CASES])
def test_a_failed_write_is_one_line_and_loses_nothing(
    write, step, what, target, mode, text_file, straight_rows, tmp_path
):
    with tiny_filesystem(tmp_path / "disk", "32m") as disk:
        run = disk / "run"
        proc = run_train_cli(
            *RUN,
            f"data.path={text_file}",
            f"hydra.run.dir={run}",
            "+callbacks.disk._target_=tests.disk_points.DiskFault",
            f"+callbacks.disk.write={write}",
            f"+callbacks.disk.mount={disk}",
            f"+callbacks.disk.mode={mode}",
            f"+callbacks.disk.step={step}",
        )
        line = one_line_error(proc)
        assert line.startswith(
            f"hf_lightning: error: could not write {what} {run / target}: {REASON[mode]}; "
        ), line
        assert_intact(run, straight_rows, read_only=mode == "read_only")
        if write == "export_weights":  # the line's advice works: free space (or remount), resume, done
            if mode == "full":
                os.remove(disk / "filler")
            else:
                subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True, capture_output=True)
            again = run_train_cli(*RUN, f"data.path={text_file}", f"hydra.run.dir={run}", "ckpt_path=last")
            assert again.returncode == 0, again.stderr[-3000:]
            assert rows(run) == straight_rows
            assert (run / "hf_model" / "model.safetensors").is_file() and (
                run / "final_metrics.json"
            ).is_file()
            assert_intact(run, straight_rows)


def test_a_disk_full_before_the_start_is_one_line(text_file, tmp_path):
    from tests.disk_points import fill

    with tiny_filesystem(tmp_path / "disk", "4m") as disk:
        fill(str(disk))
        run = disk / "run"
        proc = run_train_cli(*RUN, f"data.path={text_file}", f"hydra.run.dir={run}")
        line = one_line_error(proc)
        assert line.startswith(
            f"hf_lightning: error: hydra.run.dir={run} is not writable (No space left on device)"
        )


def test_the_tmpfs_is_real(tmp_path):
    """The control: the filesystem the tests write to really is a size-limited tmpfs."""
    with tiny_filesystem(tmp_path / "disk", "1m") as disk:
        out = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE,OPTIONS", str(disk)], capture_output=True, text=True
        )
        assert out.stdout.startswith("tmpfs") and "size=1024k" in out.stdout
