"""Fit ``HFLightningModule`` with ``HFDeepSpeedStrategy`` on gloo CPU ranks, optionally from or into a
DeepSpeed checkpoint, and write the trained weights.

Usage: ``python tests/parity/deepspeed_worker.py OUT STAGE DEVICES MAX_STEPS [--save-every N --dirpath DIR]
[--resume CKPT] [--kill-after N]``.
Lightning's ``DeepSpeedStrategy`` starts the other ranks by re-running this command line (its subprocess
launcher), so tests run it as a script with the repository root on ``PYTHONPATH``.

The data: 24 rows of :func:`tests.parity.tiny_llama_case.make_rows` in a global micro-batch of 4 rows (``4 /
DEVICES`` per rank), accumulation 2, in order; SGD (lr 0.5, constant), no clipping, the loss from the logits
(the lean loss is off under DeepSpeed). ``--save-every`` writes a checkpoint every N optimizer steps into
``DIR/step=K.ckpt`` (Lightning's ``ModelCheckpoint``; under DeepSpeed a folder, every rank its shard);
``--resume`` starts from one (``ckpt_path``). ``STAGE`` 0: no DeepSpeed (Lightning's default strategy, one
process). ``--kill-after N``: every rank sends itself SIGKILL after the update of optimizer step N
(:class:`tests.kill_points.KillAt` at ``step_end``), so nothing is written at the end. Rank 0 writes ``OUT``
(``torch.save`` of the full weights, gathered across ranks under ZeRO-3).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import datasets  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402

from hf_lightning import HFDataModule, HFLightningModule  # noqa: E402
from hf_lightning.strategies.deepspeed import deepspeed_strategy  # noqa: E402
from tests.data_support import PadOnly  # noqa: E402
from tests.parity.tiny_llama_case import make_model, make_rows  # noqa: E402

GLOBAL_MICRO_BATCH, ACCUMULATION, ROWS = 4, 2, 24


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("stage", type=int)
    parser.add_argument("devices", type=int)
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--save-every", type=int)
    parser.add_argument("--dirpath")
    parser.add_argument("--resume")
    parser.add_argument("--kill-after", type=int)
    args = parser.parse_args()

    micro_batch = GLOBAL_MICRO_BATCH // args.devices
    module = HFLightningModule(
        make_model(),
        optim={"name": "sgd", "lr": 0.5},
        scheduler={"name": "constant"},
        lean_loss=False,
        max_grad_norm=None,
    )
    data = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(make_rows(ROWS)),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=micro_batch,
        max_length=64,
        seed=0,
        shuffle=False,
        gradient_accumulation_steps=ACCUMULATION,
    )
    strategy = "auto"
    if args.stage:
        strategy = deepspeed_strategy(
            stage=args.stage,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=ACCUMULATION,
            max_grad_norm=None,
            precision="32-true",
            devices=args.devices,
        )
    callbacks = []
    if args.save_every:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=args.dirpath,
                filename="{step}",
                every_n_train_steps=args.save_every,
                save_top_k=-1,
                save_last=False,
            )
        )
    if args.kill_after:
        from tests.kill_points import KillAt

        callbacks.append(KillAt("step_end", args.kill_after, "SIGKILL"))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=bool(args.save_every),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=data, ckpt_path=args.resume)
    if args.stage:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.model.parameters())):
            weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    else:
        weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    if trainer.global_rank == 0:
        torch.save({"weights": weights, "global_step": trainer.global_step}, args.out)


if __name__ == "__main__":
    main()
