"""The throughput callback: exact counts per batch kind, the logged row, MFU arithmetic, the dense-peak
table."""

from __future__ import annotations

import csv

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import Throughput
from hf_lightning.callbacks.throughput import batch_counts, dense_peak_flops, model_flop_constants
from hf_lightning.core.errors import ConfigError
from tests.data_support import PadOnly, tiny_llama


def _value(x):
    return int(x) if isinstance(x, int) else int(x.item())


def test_padded_batch_counts():
    # two rows of 3 and 1 real tokens padded to 3: 4 real of 6 slots, 2 sequences, 3^2 + 1^2 = 10
    batch = {
        "input_ids": torch.tensor([[5, 6, 7], [8, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "labels": torch.tensor([[5, 6, 7], [8, -100, -100]]),
    }
    real, slots, sequences, squares = batch_counts(batch, pad_token_id=0, squares=True)
    assert (_value(real), slots, _value(sequences), _value(squares)) == (4, 6, 2, 10)


def test_packed_rows_counts():
    # row 0: documents of 3 and 2 tokens, then 1 pad slot; row 1: one document of 4 tokens, then 2 pad slots.
    # The pad id 0 also appears inside a document (a real token with a label): it is not padding.
    batch = {
        "input_ids": torch.tensor([[5, 0, 7, 8, 9, 0], [4, 4, 4, 4, 0, 0]]),
        "labels": torch.tensor([[-100, 0, 7, -100, 9, -100], [-100, 4, 4, 4, -100, -100]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]),
    }
    real, slots, sequences, squares = batch_counts(batch, pad_token_id=0, squares=True)
    # real 5 + 4 = 9 of 12 slots; 3 documents (the pad tails' position 0 are not documents); 9 + 4 + 16 = 29
    assert (_value(real), slots, _value(sequences), _value(squares)) == (9, 12, 3, 29)


def test_padding_free_counts():
    # sequences of 4, 3 and 2 tokens flattened into one row: no padding
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]]),
        "labels": torch.tensor([[-100, 2, 3, 4, -100, 6, 7, -100, 9]]),
        "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]]),
    }
    real, slots, sequences, squares = batch_counts(batch, pad_token_id=0, squares=True)
    assert (_value(real), slots, _value(sequences), _value(squares)) == (9, 9, 3, 16 + 9 + 4)


def test_dense_peaks_by_device_name():
    assert dense_peak_flops("NVIDIA H200") == 989e12
    assert dense_peak_flops("NVIDIA H200 NVL") == 835e12
    assert dense_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert dense_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert dense_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert dense_peak_flops("Tesla T4") is None


def test_flop_constants_leave_out_the_input_embedding():
    model = tiny_llama(vocab_size=32)  # hidden 32, 2 layers, untied head
    n, layers, width = model_flop_constants(model)
    total = sum(p.numel() for p in model.parameters())
    assert (n, layers, width) == (total - 32 * 32, 2, 32)


def test_bad_peak_is_refused():
    with pytest.raises(ConfigError, match="peak_flops"):
        Throughput(peak_flops=0)


def test_a_batch_without_input_ids_is_named():
    with pytest.raises(ConfigError, match=r"input_ids.*\['inputs_embeds'\]"):
        batch_counts({"inputs_embeds": torch.zeros(1, 2, 3)}, pad_token_id=0, squares=False)


class _Batches(L.Callback):
    """Keeps every training micro-batch as the module sees it (independent count)."""

    def __init__(self):
        self.batches = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for micro in batch:  # a window of micro-batches
            self.batches.append(
                {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in micro.items()}
            )


@pytest.mark.parametrize("packing", [False, "bfd"])
def test_logged_row_matches_the_batches(tmp_path, packing):
    from lightning.pytorch.loggers import CSVLogger

    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(48):
        n = int(torch.randint(3, 20, (), generator=g))
        ids = torch.randint(1, 32, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    tokenizer = PadOnly()
    tokenizer.eos_token_id = None  # packing reads it
    dm = HFDataModule(
        tokenizer,
        path=datasets.Dataset.from_list(rows),
        validation_split=0.0,
        per_device_train_batch_size=4,
        max_length=24,
        packing=packing,
        shuffle=False,
        gradient_accumulation_steps=2,
    )
    module = HFLightningModule(tiny_llama(vocab_size=32), optim={"lr": 1e-3}, scheduler={"name": "constant"})
    seen, meter = _Batches(), Throughput(pad_token_id=0, peak_flops=1e12)
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        log_every_n_steps=4,
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[seen, meter],
    )
    trainer.fit(module, datamodule=dm)

    with open(tmp_path / "metrics.csv") as fh:
        logged = [r for r in csv.DictReader(fh) if r.get("train/loss")]
    assert len(logged) == 1 and logged[0]["step"] == "4"
    row = {k: float(v) for k, v in logged[0].items() if v}
    # the independent count over the 8 micro-batches of the interval
    real = slots = sequences = squares = 0
    for b in seen.batches:
        ids = b["input_ids"]
        slots += ids.numel()
        if packing:
            for r in range(ids.shape[0]):
                length = ids.shape[1]
                while length and ids[r, length - 1] == 0 and b["labels"][r, length - 1] == -100:
                    length -= 1
                starts = [i for i in range(length) if b["position_ids"][r, i] == 0] + [length]
                real += length
                sequences += len(starts) - 1
                squares += sum((e - s) ** 2 for s, e in zip(starts, starts[1:]))
        else:
            lengths = b["attention_mask"].sum(1).tolist()
            real += sum(lengths)
            sequences += len(lengths)
            squares += sum(n * n for n in lengths)
    assert row["throughput/padding_share"] == pytest.approx(1 - real / slots, rel=1e-9)
    elapsed = real / row["throughput/tokens_per_s"]
    assert row["throughput/padded_tokens_per_s"] * elapsed == pytest.approx(slots, rel=1e-9)
    assert row["throughput/samples_per_s"] * elapsed == pytest.approx(sequences, rel=1e-9)
    # the PaLM constants from the model itself: every parameter but the input embedding (untied here)
    model = module.model
    assert not model.config.tie_word_embeddings
    n = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    layers, width = model.config.num_hidden_layers, model.config.hidden_size
    assert row["throughput/mfu"] * elapsed * 1e12 == pytest.approx(
        6 * n * real + 12 * layers * width * squares, rel=1e-9
    )
    if packing:
        assert real < slots  # packed rows of one batch are padded to the longest
    # consistency: what the callback exposes is what it logged
    assert meter.last_metrics["throughput/tokens_per_s"] == pytest.approx(row["throughput/tokens_per_s"])


@pytest.mark.parametrize("limits", [{"max_steps": 3}, {"max_steps": -1, "max_epochs": 1}])
def test_the_final_row_between_log_steps_has_its_rates(tmp_path, limits):
    # ended by max_steps (a log step of the module's rule) or by the epochs (the row written at train end)
    # a run that ends between log steps writes a last train/loss row for the steps since the last one: its
    # throughput columns used to be empty (final_metrics.json then held an earlier interval's rates)
    from lightning.pytorch.loggers import CSVLogger

    rows = [{"input_ids": list(range(1, n + 1)), "labels": list(range(1, n + 1))} for n in (3, 7, 4, 9, 5, 2)]
    dm = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(rows),
        validation_split=0.0,
        per_device_train_batch_size=2,
        shuffle=False,
    )
    module = HFLightningModule(tiny_llama(vocab_size=32), optim={"lr": 1e-3}, scheduler={"name": "constant"})
    seen = _Batches()
    trainer = L.Trainer(
        accelerator="cpu",
        **limits,
        log_every_n_steps=2,
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[seen, Throughput(pad_token_id=0)],
    )
    trainer.fit(module, datamodule=dm)
    with open(tmp_path / "metrics.csv") as fh:
        logged = {r["step"]: r for r in csv.DictReader(fh) if r.get("train/loss")}
    assert sorted(logged) == ["2", "3"]
    last = seen.batches[2]  # the one step of the final row, counted here
    real, slots = int(last["attention_mask"].sum()), last["input_ids"].numel()
    assert float(logged["3"]["throughput/padding_share"]) == pytest.approx(1 - real / slots, rel=1e-9)


def test_standalone_module_gets_its_own_row(tmp_path):
    """With a LightningModule that is not ours the callback writes to the loggers itself."""
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import CSVLogger

    class TokenBatches(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"input_ids": torch.full((5,), i + 1), "attention_mask": torch.tensor([1, 1, 1, 0, 0])}

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            return self.layer(batch["input_ids"].float().sum(1, keepdim=True).repeat(1, 32)).sum()

        def train_dataloader(self):
            return torch.utils.data.DataLoader(TokenBatches(), batch_size=4)

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        log_every_n_steps=2,
        enable_progress_bar=False,
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[Throughput()],
    )
    trainer.fit(Model())
    with open(tmp_path / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("throughput/padding_share")]
    assert [r["step"] for r in rows] == ["2", "4"]
    assert all(float(r["throughput/padding_share"]) == pytest.approx(0.4) for r in rows)
    assert all(not r.get("throughput/mfu") for r in rows)  # CPU: no MFU without a given peak
