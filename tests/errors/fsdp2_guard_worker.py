"""The non-finite guard under FSDP2 (``fsdp_strategy()``) on 2 gloo ranks, whose weights and gradients are
``DTensor`` shards.

Usage: ``python tests/errors/fsdp2_guard_worker.py OUTDIR weights|own``. Lightning's ``ModelParallelStrategy``
starts rank 1 by re-running this command line, so the test runs it as a script. Each rank writes
``rank{r}.json``:

- ``weights``: ``HFLightningModule``; after optimizer step 2 rank 1 writes an inf into its own shard of
  :data:`BAD` (rank 0's shard of it stays finite): ``error`` is the ``TrainingError`` message each rank raised
  (``null``: none), ``step`` the last step reached;
- ``own``: a LightningModule of one's own (automatic optimization, so the guard computes the gradient norm
  itself): ``guard`` the norms the guard read, ``whole`` the float64 norm of the gathered gradients
  (``full_tensor()`` of each) at the same steps.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch

STEPS = 3
BAD = "model.model.layers.1.mlp.down_proj.weight"


def make_model():
    from tests.data_support import tiny_llama

    return tiny_llama(vocab_size=64).train()


def rows():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 64, (8,), generator=g) for _ in range(16)]


class InfIntoRank1Shard(L.Callback):
    """After step 2, an inf in rank 1's local shard of :data:`BAD` (before the guard reads the weights)."""

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == 2 and trainer.global_rank == 1:
            with torch.no_grad():
                dict(pl_module.named_parameters())[BAD].to_local().view(-1)[0] = float("inf")


class WholeNorm(L.Callback):
    """The float64 2-norm of the gathered gradients, per step (a collective: every rank)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad.full_tensor().double() for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


class OwnModule(L.LightningModule):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def configure_model(self) -> None:  # Lightning's rule under ModelParallelStrategy; the strategy shards
        pass

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(outdir: str, kind: str) -> None:
    from torch.utils.data import DataLoader

    from hf_lightning import HFLightningModule
    from hf_lightning.callbacks import NonFiniteGuard
    from hf_lightning.core.errors import TrainingError
    from hf_lightning.strategies import fsdp_strategy

    guard = NonFiniteGuard()
    whole = WholeNorm()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=fsdp_strategy(activation_checkpointing=False),
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[InfIntoRank1Shard(), guard] if kind == "weights" else [guard, whole],
    )
    error = None
    try:
        if kind == "weights":
            import datasets

            from hf_lightning import HFDataModule
            from tests.data_support import make_word_tokenizer

            texts = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 20 : i % 20 + 3 + i % 4]) for i in range(16)]
            data = HFDataModule(
                make_word_tokenizer(),
                path=datasets.Dataset.from_dict({"text": texts}),
                validation_split=0.0,
                per_device_train_batch_size=2,
                shuffle=False,
            )
            module = HFLightningModule(
                make_model(), optim={"name": "sgd", "lr": 0.1}, scheduler={"name": "constant"}
            )
            trainer.fit(module, datamodule=data)
        else:
            trainer.fit(OwnModule(make_model()), DataLoader(rows(), batch_size=2, collate_fn=torch.stack))
    except TrainingError as err:
        error = str(err)
    out = {"error": error, "step": trainer.global_step, "guard": list(guard._norms), "whole": whole.norms}
    with open(os.path.join(outdir, f"rank{trainer.global_rank}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
