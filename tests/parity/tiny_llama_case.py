"""A tiny random Llama and SFT-like rows with unequal label counts, plus gradients computed without
hf_lightning.

Shared by the gradient-invariance tests and their DDP worker script (which the test runs with the repository
root on ``PYTHONPATH``).

The reference gradient is d(sum of token CE over all targets of all rows / number of targets)/dθ computed with
plain ``torch`` on one batch holding every row; the control is HF's fallback (a mean per micro-batch, divided
by the number of micro-batches), which must differ because the rows hold different numbers of targets.
"""

from __future__ import annotations

import lightning as L
import torch

VOCAB = 97
N_ROWS = 8


def make_model(seed: int = 0):
    """A 2-layer Llama (hidden 32, GQA 4/2 heads) from a config, fp32, deterministic init."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def make_rows(n: int = N_ROWS, seed: int = 0) -> list[dict[str, list[int]]]:
    """Rows of 6..24 tokens whose first 1..half positions are a prompt (labels -100): target counts differ."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(6, 25, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        prompt = int(torch.randint(1, length // 2 + 1, (1,), generator=g))
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def causal_targets(rows) -> list[int]:
    """Targets per row for a causal LM: labels[1:] that are not -100."""
    return [sum(t != -100 for t in r["labels"][1:]) for r in rows]


def _pad(rows):
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(r["labels"])
    return ids, mask, labels


def _ce_sum_and_count(model, rows):
    ids, mask, labels = _pad(rows)
    logits = model(input_ids=ids, attention_mask=mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != -100
    nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (nll * keep).sum(), int(keep.sum())


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def reference_gradient(state: dict, rows) -> tuple[float, dict[str, torch.Tensor]]:
    """``(loss, gradient)`` of total CE / total targets over all rows in one batch."""
    model = make_model()
    model.load_state_dict(state)
    total, count = _ce_sum_and_count(model, rows)
    loss = total / count
    loss.backward()
    return float(loss.detach()), _grads(model)


def per_rank_mean_gradient(state: dict, rank_rows: list[list]) -> tuple[float, dict[str, torch.Tensor]]:
    """``average_tokens_across_devices=False``: each rank's CE sum / its own count, averaged over ranks."""
    model = make_model()
    model.load_state_dict(state)
    losses = []
    for rows in rank_rows:
        total, count = _ce_sum_and_count(model, rows)
        losses.append(total / count)
    loss = torch.stack(losses).mean()
    loss.backward()
    return float(loss.detach()), _grads(model)


def mean_of_micro_batch_means_gradient(
    state: dict, rows, micro_batch: int
) -> tuple[float, dict[str, torch.Tensor]]:
    """The control: HF's fallback, each micro-batch's token mean divided by the number of micro-batches."""
    model = make_model()
    model.load_state_dict(state)
    chunks = [rows[i : i + micro_batch] for i in range(0, len(rows), micro_batch)]
    means = []
    for chunk in chunks:
        total, count = _ce_sum_and_count(model, chunk)
        means.append(total / count)
    loss = torch.stack(means).sum() / len(chunks)
    loss.backward()
    return float(loss.detach()), _grads(model)


def relative_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[float, float]:
    """``(whole-model ||g - ref|| / ||ref||, max over tensors of the same ratio)``."""
    assert grads.keys() == reference.keys(), sorted(set(grads) ^ set(reference))
    diff = torch.sqrt(sum(((grads[n] - reference[n]) ** 2).sum() for n in reference))
    norm = torch.sqrt(sum((reference[n] ** 2).sum() for n in reference))
    per_tensor = max(
        float((grads[n] - reference[n]).norm() / reference[n].norm().clamp(min=1e-30)) for n in reference
    )
    return float(diff / norm), per_tensor


# ------------------------------------------------------------------------------------- the Lightning side
_SYNCS: list[int] = []  # gradient all-reduce calls seen by the DDP comm hook on this process


def _counting_allreduce(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    _SYNCS.append(bucket.index())
    return allreduce_hook(state, bucket)


class CaptureGradients(L.Callback):
    """Saves the gradient Lightning is about to step with (after accumulation and DDP's all-reduce, before
    clipping) and, under DDP, how many all-reduce calls had run after each micro-batch's backward."""

    def __init__(self, outdir) -> None:
        self.outdir = str(outdir)
        self.syncs_after_batch: list[int] = []

    def on_train_start(self, trainer, pl_module):
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, _counting_allreduce)

    def on_after_backward(self, trainer, pl_module):
        self.syncs_after_batch.append(len(_SYNCS))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = {n.removeprefix("model."): p.grad.detach().clone() for n, p in pl_module.named_parameters()}
        torch.save(grads, f"{self.outdir}/grads_rank{trainer.global_rank}.pt")

    def on_train_end(self, trainer, pl_module):
        torch.save(self.syncs_after_batch, f"{self.outdir}/syncs_rank{trainer.global_rank}.pt")


def run_lightning_step(
    state: dict,
    rows,
    micro_batch: int,
    accumulation: int,
    outdir,
    devices: int = 1,
    average_tokens: bool = True,
    model_factory=None,
    chunk_size: int | None = None,
    **module_kwargs,
) -> None:
    """One optimizer step of HFLightningModule + HFDataModule on ``rows`` (no shuffle); writes
    ``grads_rank{r}.pt``, ``syncs_rank{r}.pt`` and ``metrics.csv`` into ``outdir``. ``model_factory`` (default
    :func:`make_model`) builds the model ``state`` is loaded into; ``chunk_size`` sets the lean loss's tokens
    per chunk; ``module_kwargs`` go to ``HFLightningModule`` (e.g. ``lean_loss=False``)."""
    from types import SimpleNamespace

    import datasets
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.strategies import DDPStrategy

    from hf_lightning import HFDataModule, HFLightningModule

    model = (model_factory or make_model)()
    model.load_state_dict(state)
    module = HFLightningModule(
        model,
        optim={"name": "sgd", "lr": 0.1},
        scheduler={"name": "constant"},
        average_tokens_across_devices=average_tokens,
        max_grad_norm=None,
        **module_kwargs,
    )
    module.lean.chunk_size = chunk_size
    data = HFDataModule(
        SimpleNamespace(pad_token_id=0),
        path=datasets.Dataset.from_list(rows),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=micro_batch,
        shuffle=False,
        max_length=64,
        gradient_accumulation_steps=accumulation,
    )
    strategy = "auto" if devices == 1 else DDPStrategy(start_method="spawn", process_group_backend="gloo")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=1,
        logger=CSVLogger(str(outdir), name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[CaptureGradients(outdir)],
    )
    trainer.fit(module, datamodule=data)


def read_logged_losses(outdir) -> list[float]:
    import csv

    with open(f"{outdir}/metrics.csv") as fh:
        return [float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")]
