"""``python -m hf_lightning.inspect_batch +experiment=sft [overrides]``: print one training batch as the model
gets it.

The same Hydra config as ``python -m hf_lightning.train`` (``conf/train.yaml``) and the same overrides. The
model, tokenizer, DataModule and LightningModule come from the builder training uses
(:func:`hf_lightning.config.build.build`, ``purpose="inspect"``), attached to a one-process CPU
``lightning.Trainer`` that is never fitted (so pruning reads the model's ``forward``, and a window holds
``data.gradient_accumulation_steps`` micro-batches); the first batch of the training loader (rank 0) is
printed with :func:`~hf_lightning.data.describe.describe_batch`.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from hf_lightning.cli.process import hide_library_warnings
from hf_lightning.core.errors import HFLightningError


def first_batch(cfg: DictConfig) -> tuple[Any, Any]:
    """``(batch, datamodule)``: the first training batch for ``cfg`` (rank 0 of one process).

    Raises:
        HFLightningError: bad config, data or model.
    """
    from hf_lightning.config.build import build
    from hf_lightning.core.batch import MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_LENGTH_KEY, Window

    datamodule = build(cfg, "inspect").datamodule
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    if isinstance(batch, Window):  # the first micro-batch of the first window, with the window's counts
        counts = {WINDOW_LENGTH_KEY: len(batch)}
        if batch.counts is not None:
            counts = {NUM_ITEMS_KEY: batch.num_items_in_batch, MICRO_ITEMS_KEY: batch.counts[0], **counts}
        batch = {**batch.micro_batches[0], **counts}
    return batch, datamodule


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    hide_library_warnings()
    from hf_lightning.data.describe import describe_batch

    try:
        batch, dm = first_batch(cfg)
    except HFLightningError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"format: {dm.data_format}; training batch 1 of rank 0 (as the model receives it)")
    print(describe_batch(batch, dm.tokenizer, dm.dropped_columns, dm.id2label))


if __name__ == "__main__":
    from hf_lightning.cli.output import quiet_known_noise

    quiet_known_noise()
    from hf_lightning.config.typos import exit_on_misspelt_override

    sys.argv[1:] = exit_on_misspelt_override(sys.argv[1:], "train", "inspect")
    main()
