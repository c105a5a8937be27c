"""Train a small Llama for 3 optimizer steps on 2 gloo ranks with ``strategy=fsdp`` (FSDP2) or DDP and write
what each rank held and sent.

Usage: ``python tests/parity/fsdp2_worker.py OUTDIR fsdp|ddp|plain|own``: ``fsdp`` is ``fsdp_strategy()``
with ``HFLightningModule``; ``plain`` Lightning's own ``ModelParallelStrategy`` with an ``HFLightningModule``
whose ``configure_model`` shards itself (``shard_module``); ``own`` ``fsdp_strategy()`` with a LightningModule
of one's own (automatic optimization, Lightning's ``accumulate_grad_batches=2``, an empty
``configure_model``). Lightning's ``ModelParallelStrategy`` starts
rank 1 by re-running this command line, so the test runs it as a script in a subprocess. Each rank writes
``rank{r}.json``:

- ``bytes``: the bytes of the distinct storages behind the parameters, their gradients and the optimizer
  state (AdamW's two moments and step) that this rank holds, measured just before the second optimizer step
  (every one of them exists then); a ``DTensor`` counts its local shard's storage (padding included);
- ``reduce_scatters``: the calls of ``torch.distributed.reduce_scatter_single`` (FSDP2's gradient reduction,
  counted by wrapping the real collective), ``units``: the FSDP units (blocks + root);

and the CSV logger writes ``OUTDIR/KIND/metrics.csv``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import lightning as L
import torch
import torch.distributed as dist

logging.basicConfig(level=logging.INFO)

STEPS, ACCUMULATION, MICRO_BATCH = 3, 2, 2
VOCAB = 512
CALLS = {"reduce_scatters": 0}
_reduce_scatter = dist.reduce_scatter_single


def counted_reduce_scatter(*args, **kwargs):
    CALLS["reduce_scatters"] += 1
    return _reduce_scatter(*args, **kwargs)


dist.reduce_scatter_single = counted_reduce_scatter


def make_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def make_rows(n: int = 32):
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        length = int(torch.randint(8, 33, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor: its local shard's)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class Measure(L.Callback):
    def __init__(self, outdir: str) -> None:
        self.outdir = outdir
        self.bytes: dict[str, int] | None = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step != 1 or self.bytes is not None:  # the second step: optimizer state and
            return  # gradients exist
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        self.bytes = {
            "params": held_bytes(params),
            "grads": held_bytes(p.grad for p in params),
            "optimizer_state": held_bytes(state),
        }

    def on_train_end(self, trainer, pl_module) -> None:
        from torch.distributed.fsdp import FSDPModule

        units = sum(isinstance(m, FSDPModule) for m in trainer.strategy.model.modules())
        out = {
            "bytes": self.bytes,
            "reduce_scatters": CALLS["reduce_scatters"],
            "units": units,
        }
        with open(os.path.join(self.outdir, f"rank{trainer.global_rank}.json"), "w") as fh:
            json.dump(out, fh)


class SelfSharding:
    """``HFLightningModule`` applying FSDP2 in its own ``configure_model`` (Lightning's documented way)."""

    @staticmethod
    def make(model):
        from hf_lightning import HFLightningModule
        from hf_lightning.strategies import NoSplitModulesPolicy, shard_module

        class Module(HFLightningModule):
            def configure_model(self) -> None:
                shard_module(self, self.device_mesh["data_parallel"], NoSplitModulesPolicy())

        return Module(model, optim={"name": "adamw_torch", "lr": 1e-3}, scheduler={"name": "constant"})


class OwnModule(L.LightningModule):
    """A LightningModule of one's own: the HF model's own loss, AdamW, automatic optimization."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def configure_model(self) -> None:  # Lightning's rule under ModelParallelStrategy; the strategy shards
        pass

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit_own(outdir: str) -> None:
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader

    from hf_lightning.strategies import fsdp_strategy

    rows = [torch.tensor(r["input_ids"][:8]) for r in make_rows() if len(r["input_ids"]) >= 8]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=fsdp_strategy(),
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATION,
        logger=CSVLogger(outdir, name="", version="own"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Measure(outdir)],
    )
    loader = DataLoader(rows, batch_size=MICRO_BATCH, collate_fn=torch.stack)
    trainer.fit(OwnModule(make_model()), loader)


def main(outdir: str, kind: str) -> None:
    from types import SimpleNamespace

    import datasets
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.strategies import fsdp_strategy

    if kind == "own":
        return fit_own(outdir)
    if kind == "plain":
        module = SelfSharding.make(make_model())
    else:
        module = HFLightningModule(
            make_model(), optim={"name": "adamw_torch", "lr": 1e-3}, scheduler={"name": "constant"}
        )
    data = HFDataModule(
        SimpleNamespace(pad_token_id=0),
        path=datasets.Dataset.from_list(make_rows()),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=MICRO_BATCH,
        shuffle=False,
        max_length=64,
        gradient_accumulation_steps=ACCUMULATION,
    )
    strategies = {
        "fsdp": lambda: fsdp_strategy(activation_checkpointing=False),
        "ddp": lambda: DDPStrategy(process_group_backend="gloo"),
        "plain": lambda: ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
    }
    strategy = strategies[kind]()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=STEPS,
        logger=CSVLogger(outdir, name="", version=kind),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[Measure(outdir)],
    )
    trainer.fit(module, datamodule=data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
