"""Save what Lightning does not (RNG states, the data settings) and warn when a resume cannot be exact."""

from __future__ import annotations

import logging
import random
from typing import Any

import lightning as L
import numpy as np
import torch

from hf_lightning.checkpointing.loop_state import ends_epoch, reopen_stopped_epoch
from hf_lightning.checkpointing.sharded import is_sharded_strategy, resharding_problem
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.dataloaders import data_signature, describe_differences

log = logging.getLogger(__name__)

KEY = "hf_lightning"


def _signature(trainer: L.Trainer) -> dict[str, Any]:
    return {
        "gradient_accumulation_steps": getattr(trainer.datamodule, "gradient_accumulation_steps", 1),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        **data_signature(trainer.datamodule, trainer.world_size),
    }


def _numpy_state() -> tuple:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))


class ResumeState(L.Callback):
    """Adds RNG states (python, numpy, torch, per rank) and the run's data signature to every checkpoint.

    On load the RNG states of this rank are restored, and a warning names every setting that changed
    since the checkpoint (batch size, accumulation, world size, max length, seed, dataset fingerprint):
    any of them makes the resumed data order or loss differ from the uninterrupted run.

    A sharded run's checkpoint written by another number of ranks resumes when the rows per optimizer step are
    the same (the model and optimizer state are resharded, the data position names the same rows), and is
    refused in one line otherwise (:func:`~hf_lightning.checkpointing.sharded.resharding_problem`).

    A checkpoint written after ``trainer.max_steps`` (or a stop) ended training in the middle of an epoch
    records that epoch as unfinished (:func:`~hf_lightning.checkpointing.loop_state.reopen_stopped_epoch`): a
    run continued from it with a larger ``max_steps`` trains the rest of the epoch, as the uninterrupted run
    does.
    """

    def __init__(self) -> None:
        self._epoch_open = False  # some batches of the current epoch trained, and not its last

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_open = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch_open = not ends_epoch(trainer, batch_idx)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        rng = {
            "python": random.getstate(),
            # as plain values and a tensor: Lightning loads checkpoints with torch.load(weights_only=True)
            "numpy": _numpy_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        ranks = [rng]
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            # Lightning's strategies have no object gather; every rank dumps the checkpoint, so all take part
            ranks = [None] * trainer.world_size
            torch.distributed.all_gather_object(ranks, rng)
        checkpoint[KEY] = {"rng": ranks, "signature": _signature(trainer)}
        reopen_stopped_epoch(checkpoint, ended_early=self._epoch_open)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        from hf_lightning.checkpointing.tidy import restored_dirpaths

        self._restored_dirpaths = restored_dirpaths(checkpoint)
        state = checkpoint.get(KEY)
        if not state:
            log.warning(
                "the checkpoint holds no hf_lightning resume state (RNG, data signature): resume may differ"
            )
            return
        rngs = state["rng"]
        rng = rngs[trainer.global_rank] if trainer.global_rank < len(rngs) else rngs[0]
        random.setstate(rng["python"])
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        saved = dict(state["signature"])
        if "gradient_accumulation_steps" not in saved and not pl_module.automatic_optimization:
            # written by the micro-batch loop (Lightning's accumulation): its counts become windows
            # (HFLightningModule.on_load_checkpoint has read its loop state as windows)
            accumulation = int(saved.pop("accumulate_grad_batches", 1) or 1)
            saved.update(gradient_accumulation_steps=accumulation, accumulate_grad_batches=1)
        self._saved_signature = saved
        if is_sharded_strategy(trainer.strategy):
            problem = resharding_problem(saved, _signature(trainer))
            if problem:
                raise ConfigError(f"ckpt_path={trainer.ckpt_path}: cannot resume: {problem}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from hf_lightning.checkpointing.tidy import tidy_checkpoint_folders

        for logger in trainer.loggers:  # rows logged after the checkpoint's step are logged again
            if hasattr(logger, "truncate_after"):
                logger.truncate_after(trainer.global_step)
        # and checkpoints written after it are written again
        tidy_checkpoint_folders(trainer, getattr(self, "_restored_dirpaths", None))
        saved = getattr(self, "_saved_signature", None)
        if saved is None:
            return
        diffs = describe_differences(saved, _signature(trainer))
        if diffs:
            log.warning(
                "resuming with settings that changed since the checkpoint, so the run cannot continue "
                "exactly as it would have: %s",
                "; ".join(diffs),
            )
