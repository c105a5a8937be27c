"""``python -m hf_lightning.inspect_batch +experiment=sft [overrides]``: print one training batch as the model gets it.

The same Hydra config as ``python -m hf_lightning.train`` (``conf/train.yaml``) and the same overrides. The
model, tokenizer, DataModule and LightningModule are built as training builds them, attached to a
``lightning.Trainer`` that is never fitted (so pruning reads the model's ``forward``, and the window count
uses ``trainer.accumulate_grad_batches``); the first batch of the training loader (rank 0) is printed with
:func:`~hf_lightning.data.describe.describe_batch`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hf_lightning.errors import HFLightningError


def first_batch(cfg: DictConfig) -> tuple[Any, Any]:
    """``(batch, datamodule)``: the first training batch for ``cfg`` (rank 0 of one process).

    Raises:
        HFLightningError: bad config, data or model.
    """
    import lightning as L

    from hf_lightning.config_check import check_keys
    from hf_lightning.data import HFDataModule
    from hf_lightning.models import load_model_and_tokenizer
    from hf_lightning.module import HFLightningModule

    check_keys(cfg.data, HFDataModule.__init__, "data", skip=("tokenizer",))
    check_keys(cfg.model, load_model_and_tokenizer, "model")
    if cfg.data.path == "???":
        from hf_lightning.errors import ConfigError

        raise ConfigError(
            "data.path is required by this experiment: a json/jsonl/csv/parquet file or a save_to_disk folder"
        )
    model, tokenizer = load_model_and_tokenizer(**OmegaConf.to_container(cfg.model, resolve=True))
    datamodule = HFDataModule(tokenizer=tokenizer, **OmegaConf.to_container(cfg.data, resolve=True))
    trainer_cfg = cfg.get("trainer") or {}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        accumulate_grad_batches=int(trainer_cfg.get("accumulate_grad_batches") or 1),
        max_steps=int(trainer_cfg.get("max_steps") or -1),
    )
    trainer.strategy.connect(HFLightningModule(model, tokenizer=tokenizer))
    datamodule.trainer = trainer
    datamodule.setup("fit")
    return next(iter(datamodule.train_dataloader())), datamodule


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from hf_lightning.data.describe import describe_batch

    try:
        batch, dm = first_batch(cfg)
    except HFLightningError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"format: {dm.data_format}; training batch 1 of rank 0 (as the model receives it)")
    print(describe_batch(batch, dm.tokenizer, dm.dropped_columns, dm.id2label))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hf_lightning.cli_output import quiet_known_noise

    quiet_known_noise()
    main()
