"""A DeepSpeed run's checkpoint folder is written atomically with a SHA-256 manifest: a resume check reads it
as a checkpoint (its step, its parts), and a file whose bytes changed, a ``latest`` naming no tag folder, or
a tag folder without its model states is refused in one line naming what is wrong.

The folder is a real one: a one-process ZeRO-2 fit on the CPU (:class:`HFDeepSpeedStrategy`, DeepSpeed's CPU
accelerator) with Lightning's ``ModelCheckpoint``, so the engine's ``save_checkpoint`` wrote it through
:class:`~hf_lightning.checkpointing.sharded.AtomicShardedCheckpoints`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from hf_lightning.checkpointing.resume import checkpoint_problem
from hf_lightning.checkpointing.sharded import MANIFEST, write_manifest

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow  # a DeepSpeed engine's start-up


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """``step=2.ckpt/``, the checkpoint folder of 2 ZeRO-2 steps on one CPU process, and the rendezvous
    variables of the environment after the fit (before it: ``MASTER_PORT`` set, the others absent)."""
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    from hf_lightning.strategies.deepspeed import HFDeepSpeedStrategy
    from hf_lightning.strategies.launch import RENDEZVOUS

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_ACCELERATOR", "cpu")
        for key in RENDEZVOUS:
            mp.setenv(key, "")  # recorded, so that the context puts back what was there
            mp.delenv(key)
        port = str(find_free_network_port())
        mp.setenv("MASTER_PORT", port)
        folder = tmp_path_factory.mktemp("ds") / "checkpoints"
        config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
        config["zero_allow_untested_optimizer"] = True
        x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            strategy=HFDeepSpeedStrategy(config=config),
            max_steps=2,
            logger=False,
            callbacks=[
                L.pytorch.callbacks.ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=2)
            ],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(_Regression(), DataLoader(list(zip(x, x.sum(1, keepdim=True))), batch_size=4))
        import deepspeed.comm
        import torch.distributed as dist

        if dist.is_initialized():  # DeepSpeed's own, which also drops the groups it caches
            deepspeed.comm.destroy_process_group()
        after = {key: os.environ.get(key) for key in RENDEZVOUS}
    return folder / "step=2.ckpt", port, after


@pytest.fixture(scope="module")
def written(fitted):
    return fitted[0]


def test_the_fit_leaves_the_rendezvous_variables_as_they_were(fitted):
    """Lightning's launcher and the set-up wrote ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``
    for DeepSpeed's process group; left behind, an HF ``Trainer`` created later in the process (accelerate
    reads ``LOCAL_RANK``) would wait for a world that does not exist."""
    _, port, after = fitted
    assert after == {
        "MASTER_ADDR": None,
        "MASTER_PORT": port,
        "RANK": None,
        "WORLD_SIZE": None,
        "LOCAL_RANK": None,
    }


@pytest.fixture
def folder(written, tmp_path):
    copy = tmp_path / "step=2.ckpt"
    shutil.copytree(written, copy)
    return copy


def test_the_folder_is_in_place_whole_with_a_manifest_of_every_file(written):
    """No temporary folder is left beside it; the manifest lists the SHA-256 of every other file (the
    engine's ``latest``, model and optimizer states), as ``sha256sum -c`` checks it; the resume check reads
    the step."""
    assert sorted(os.listdir(written.parent)) == ["step=2.ckpt"]
    files = sorted(
        os.path.relpath(os.path.join(root, n), written) for root, _, names in os.walk(written) for n in names
    )
    assert {"latest", "checkpoint/mp_rank_00_model_states.pt"} <= set(files)
    assert "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt" in files
    listed = dict(reversed(line.split("  ")) for line in (written / MANIFEST).read_text().splitlines())
    assert sorted(listed) == [f for f in files if f != MANIFEST]
    assert listed == {f: hashlib.sha256((written / f).read_bytes()).hexdigest() for f in listed}
    check = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=written, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert checkpoint_problem(str(written)) == (None, 2)


def test_a_flipped_byte_in_the_optimizer_states_is_damage_naming_the_file(folder):
    part = folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    assert checkpoint_problem(str(folder)) == (
        "is damaged: the SHA-256 of checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt does not match "
        "the one written with it (manifest.sha256), so its bytes changed after it was saved (a failing disk "
        "or an incomplete copy)",
        None,
    )


def test_latest_naming_no_tag_folder_is_damage(folder):
    (folder / "latest").write_text("global_step9")
    write_manifest(str(folder))  # the manifest agrees: the damage is in what the files say
    assert checkpoint_problem(str(folder)) == (
        "is damaged: its latest names global_step9, which is not a folder in it",
        None,
    )


def test_a_tag_folder_without_model_states_is_damage(folder):
    os.unlink(folder / "checkpoint" / "mp_rank_00_model_states.pt")
    write_manifest(str(folder))
    problem, step = checkpoint_problem(str(folder))
    assert step is None
    assert problem.startswith("is damaged: it holds no DeepSpeed model states (FileNotFoundError: "), problem
