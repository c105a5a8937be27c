"""Export the trained model and its tokenizer with ``save_pretrained`` at the end of training."""

from __future__ import annotations

import logging
import os
from typing import Any

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy

from hf_lightning.compat import unwrap_without_deepspeed, zero3_full_state_dict

log = logging.getLogger(__name__)


def full_model_state_dict(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any] | None:
    """The HF model's complete state dict, gathered from every rank (a collective: call it on all ranks).

    - DDP / single device: the module's own weights (``None``: ``save_pretrained`` reads them itself).
    - FSDP2 (``ModelParallelStrategy``, ``strategy=fsdp``): torch's ``get_model_state_dict`` with
      ``full_state_dict=True``, whole tensors on rank 0.
    - FSDP1 (Lightning's ``FSDPStrategy``): the FSDP full state dict on rank 0 (an HF folder holds whole
      tensors).
    - DeepSpeed ZeRO-3: the engine's consolidated 16-bit weights
      (``stage3_gather_16bit_weights_on_model_save``, which the derived DeepSpeed config sets), as HF
      ``Trainer`` exports them.

    Keys are the HF model's (the LightningModule's ``model.`` prefix removed).
    """
    strategy = trainer.strategy
    name = type(strategy).__name__
    if "DeepSpeed" in name and getattr(strategy, "zero_stage_3", False):
        state = zero3_full_state_dict(strategy.deepspeed_engine)
    elif isinstance(strategy, ModelParallelStrategy):
        # FSDP2 (strategy=fsdp): DTensor shards gathered into whole tensors on rank 0 (torch's state-dict API)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(strategy.model, options=options)
        # a tied parameter (an LM head sharing the embedding) is gathered once per name: one tensor again, so
        # that save_pretrained drops the tied name as it does for the unsharded model
        first: dict[int, str] = {}
        for key, param in strategy.model.named_parameters(remove_duplicate=False):
            if id(param) in first and key in state and first[id(param)] in state:
                state[key] = state[first[id(param)]]
            first.setdefault(id(param), key)
    elif "FSDP" in name:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(strategy.model, StateDictType.FULL_STATE_DICT, config):
            state = strategy.model.state_dict()
    else:
        return None
    if not trainer.is_global_zero:
        return {}
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


class HFExport(L.Callback):
    """Write ``dirpath/`` with ``model.save_pretrained`` and ``tokenizer.save_pretrained`` (rank 0 writes).

    The folder loads with the ``transformers`` Auto class of the model's task and keeps the tokenizer's chat
    template. Under FSDP and DeepSpeed ZeRO-3 the weights are gathered from every rank first
    (:func:`full_model_state_dict`), so the export is one consolidated folder.

    A ``peft`` model exports its adapter, or with ``merge_adapters`` the merged model
    (:mod:`hf_lightning.adapters.export`); the tokenizer is saved with either.

    Args:
        dirpath: the export folder (created).
        merge_adapters: with ``peft``: save the base model with the adapter merged instead of the adapter
            (``export.merge_adapters``); ignored without ``peft``.
    """

    def __init__(self, dirpath: str, merge_adapters: bool = False) -> None:
        self.dirpath = dirpath
        self.merge_adapters = merge_adapters

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if getattr(pl_module, "preempted", False):
            if trainer.is_global_zero:
                log.warning("training was stopped by a signal: no hf_model/ export until the run finishes")
            return
        self.export(trainer, pl_module)

    def export(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the folder (a collective under FSDP / DeepSpeed ZeRO-3: call it on every rank).

        The model and tokenizer are saved into a temporary folder beside ``dirpath``, which then replaces it
        (:func:`~hf_lightning.checkpointing.files.atomic_folder`): a kill leaves the previous export or none,
        never a partial one.

        Raises:
            TrainingError: the disk refused a write (full, read-only, permissions); names the folder.
        """
        from hf_lightning.adapters.checkpoint import is_adapter_model
        from hf_lightning.adapters.export import save_adapter, save_merged
        from hf_lightning.checkpointing.files import atomic_folder, disk_error, write_failure_message
        from hf_lightning.core.errors import TrainingError
        from hf_lightning.data.chat import stop_on_end_of_turn

        state = full_model_state_dict(trainer, pl_module)  # every rank takes part in the gather
        # FSDP2's parameters are shards: the adapter is written from the gathered tensors
        sharded_state = state if isinstance(trainer.strategy, ModelParallelStrategy) else None
        if not trainer.is_global_zero:
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.dirpath)), exist_ok=True)
            what = "the model"
            tokenizer = getattr(pl_module, "tokenizer", None)
            if tokenizer is not None:  # a chat model stops on its template's end-of-turn token too
                stop_on_end_of_turn(pl_module.model, tokenizer)
            with atomic_folder(self.dirpath) as tmp, unwrap_without_deepspeed():
                if is_adapter_model(pl_module.model):
                    what = (
                        save_merged(pl_module.model, tmp, sharded_state)
                        if self.merge_adapters
                        else save_adapter(pl_module.model, tmp, self.dirpath, sharded_state)
                    )
                else:
                    pl_module.model.save_pretrained(tmp, state_dict=state)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        except Exception as err:
            cause = disk_error(err)
            if cause is None:
                raise
            kept = (
                "the previous export there is intact"
                if os.path.isdir(self.dirpath)
                else "nothing was exported"
            )
            raise TrainingError(
                write_failure_message(
                    "the exported model",
                    self.dirpath,
                    cause,
                    f"{kept}; every checkpoint is kept",
                    "then resume with ckpt_path=last to export",
                )
            ) from err
        log.info("exported %s and the tokenizer to %s", what, self.dirpath)
