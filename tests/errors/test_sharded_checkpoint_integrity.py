"""A sharded run's checkpoint folder carries a SHA-256 manifest of its files: a shard whose bytes changed, a
file missing or added is refused in one line naming it; a resume on another number of ranks that would move
the data position is refused saying what to set.

The folder is a real ``torch.distributed.checkpoint`` one (one process, ``write_shards``), with Lightning's
``meta.pt`` beside it, as :class:`~hf_lightning.checkpointing.sharded.AtomicShardedCheckpoints` writes it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
import torch

from hf_lightning.checkpointing.resume import checkpoint_problem
from hf_lightning.checkpointing.sharded import (
    MANIFEST,
    resharding_problem,
    write_manifest,
    write_shards,
)


@pytest.fixture
def folder(tmp_path):
    """``last.ckpt/``: a linear layer and its SGD state in DCP, ``meta.pt`` at step 7, the manifest."""
    import warnings

    model = torch.nn.Linear(4, 3)
    path = tmp_path / "last.ckpt"
    path.mkdir()
    state = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "optimizer_0": {"x": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # DCP: "assuming the intent is to save in a single process"
        write_shards(state, str(path))
    meta = {"global_step": 7, "loops": {"fit_loop": {}}, "lr_schedulers": [{}], "epoch": 0}
    torch.save(meta, path / "meta.pt")
    write_manifest(str(path))
    return path


def test_the_manifest_lists_every_file_as_sha256sum_does(folder):
    listed = dict(reversed(line.split("  ")) for line in (folder / MANIFEST).read_text().splitlines())
    files = sorted(n for n in os.listdir(folder) if n != MANIFEST)
    assert sorted(listed) == files == [".metadata", "__0_0.distcp", "meta.pt"]
    assert listed == {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in files}
    check = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=folder, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert checkpoint_problem(str(folder)) == (None, 7)


def test_a_flipped_byte_in_a_shard_is_damage_naming_the_file(folder):
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert checkpoint_problem(str(folder)) == (
        "is damaged: the SHA-256 of __0_0.distcp does not match the one written with it (manifest.sha256), "
        "so its bytes changed after it was saved (a failing disk or an incomplete copy)",
        None,
    )


def test_only_rank_0_hashes_the_files_the_other_ranks_check_the_listing(folder, monkeypatch):
    """A launched job's rank 1 does not read the shards to hash them (rank 0 does, and its verdict is
    broadcast at the load): a flipped byte passes there, a missing file does not; rank 0 finds the byte."""
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    assert checkpoint_problem(str(folder)) == (None, 7)
    monkeypatch.setenv("RANK", "0")
    assert checkpoint_problem(str(folder))[0].startswith(
        "is damaged: the SHA-256 of __0_0.distcp does not match"
    )
    monkeypatch.setenv("RANK", "1")
    (folder / "meta.pt").rename(folder / "moved.pt")
    assert checkpoint_problem(str(folder))[0] == (
        "is damaged: meta.pt is listed in its manifest.sha256 but missing (an incomplete copy)"
    )


def test_a_missing_or_added_file_is_damage(folder):
    (folder / "stray.txt").write_text("x")
    assert checkpoint_problem(str(folder))[0] == (
        "is damaged: stray.txt is not listed in its manifest.sha256 (a file added after it was saved)"
    )
    (folder / "stray.txt").unlink()
    (folder / "meta.pt").unlink()
    assert checkpoint_problem(str(folder))[0] == (
        "is damaged: meta.pt is listed in its manifest.sha256 but missing (an incomplete copy)"
    )


def test_a_folder_without_its_loop_state_or_optimizer_is_refused(folder):
    (folder / MANIFEST).unlink()  # written elsewhere: nothing to check the bytes against
    torch.save({"global_step": 7, "loops": {"fit_loop": {}}, "lr_schedulers": []}, folder / "meta.pt")
    assert checkpoint_problem(str(folder)) == ("lacks lr_schedulers", 7)
    assert checkpoint_problem(str(folder), weights_only=True) == (None, 7)


def signature(world, batch, accumulation=2):
    return {
        "world_size": world,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "accumulate_grad_batches": 1,
    }


def test_a_resume_on_other_ranks_keeps_the_rows_per_step_or_is_refused():
    # the same 8 rows per optimizer step: the loader's windows name the same rows of the global order
    assert resharding_problem(signature(2, 2), signature(1, 4)) is None
    assert resharding_problem(signature(2, 2), signature(4, 1)) is None
    assert resharding_problem(signature(2, 2), signature(2, 4)) is None  # same ranks: ResumeState warns
    assert resharding_problem(signature(2, 2), signature(1, 2)) == (
        "it was written by 2 ranks x 2 rows x 2 micro-batches = 8 rows per optimizer step, and this run "
        "takes 4: the checkpoint's data position (windows consumed) would name other rows; set "
        "data.per_device_train_batch_size=4 to keep 8 rows per step"
    )
    assert "run on 3 ranks" in resharding_problem(signature(3, 1, 1), signature(2, 1, 1))
