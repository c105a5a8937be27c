"""``trainer.precision=bf16-mixed`` on the CPU for every batch layout: 20 optimizer steps through the one
builder (``python -m hf_lightning.train``'s ``train(cfg)``), and an fp32 run of the same config side by side
as the reference. The final ``train/loss`` stays within 2% of fp32's, while 20 steps move the loss by much
more than 2% (so the band could fail), and the two are not equal (so autocast ran). The causal-LM layouts run
the lean loss (its chunked head under autocast, the loss in float32). ``bf16-true`` (bfloat16 weights and
optimizer state) runs the same layouts to the end with a falling loss."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from tests.data_support import shared_data

STEPS = 20
SHRINK = (
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    f"trainer.max_steps={STEPS}",
    "trainer.max_epochs=-1",
    "trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=4",
    "scheduler.warmup_steps=0",
)
LLAMA = (
    "model.config.hidden_size=32",
    "model.config.intermediate_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.num_key_value_heads=2",
    "optim.lr=3e-3",
)
T5 = (
    "model.config.d_model=32",
    "model.config.d_ff=64",
    "model.config.d_kv=8",
    "model.config.num_layers=1",
    "model.config.num_decoder_layers=1",
    "optim.lr=1e-2",
)
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "and",
    "runs",
    "far",
    "away",
    "from",
    "home",
]
# layout -> (overrides, the name in data.layout=auto's line, the lean loss on)
LAYOUTS = {
    "padded": (("+experiment=clm", "data.layout=null", *LLAMA), None, True),  # null: no layout line
    "packed_per_batch": (("+experiment=clm", *LLAMA), "packed per batch", True),
    "padding_free": (("+experiment=clm", "data.padding_free=true", *LLAMA), "padding-free", True),
    "packed_bfd": (
        ("+experiment=clm", "data.packing=bfd", "data.max_length=32", *LLAMA),
        "packing=bfd",
        True,
    ),
    "seq2seq": (("+experiment=seq2seq", *T5), "padded", True),
    "classification": (
        ("+experiment=classification", "data.max_length=32", "optim.lr=1e-4"),
        "length-grouped",
        False,
    ),
}
SLOW = {"padded", "padding_free", "seq2seq", "classification"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision_data")
    texts = [" ".join(WORDS[i % 6 : i % 6 + 3 + i % 9]) for i in range(240)]
    (folder / "text.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    pairs = [{"source": t, "target": " ".join(reversed(t.split()))} for t in texts]
    (folder / "pairs.jsonl").write_text("\n".join(json.dumps(p) for p in pairs))
    with open(shared_data() / "banking77" / "train.csv") as fh:
        rows = list(csv.reader(fh))
    with open(folder / "classes.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows[:481:2])  # the header and 240 rows of 4 classes
    return folder


def data_path(files, layout: str) -> str:
    name = {"seq2seq": "pairs.jsonl", "classification": "classes.csv"}.get(layout, "text.jsonl")
    return f"data.path={files / name}"


def run(tmp_path, overrides, precision):
    """``train(cfg)`` of the config; ``(first and last train/loss, the trained module)``."""
    from hf_lightning.config.compose import compose_train
    from hf_lightning.train import train

    out = tmp_path / precision
    cfg = compose_train([*SHRINK, *overrides, f"trainer.precision={precision}"], output_dir=out)
    metrics, objects = train(cfg)
    with open(out / "metrics.csv") as fh:
        losses = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")}
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert metrics["train/loss"] == pytest.approx(losses[STEPS], rel=1e-6)
    return losses[1], losses[STEPS], objects["module"]


@pytest.mark.parametrize(
    "layout", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW else k for k in LAYOUTS]
)
def test_bf16_mixed_ends_within_2_percent_of_fp32(tmp_path, files, caplog, layout):
    overrides, layout_name, lean = LAYOUTS[layout]
    overrides = (*overrides, data_path(files, layout))
    caplog.set_level(logging.INFO)
    first32, last32, module32 = run(tmp_path, overrides, "32-true")
    first16, last16, module16 = run(tmp_path, overrides, "bf16-mixed")
    if layout_name is not None:
        assert f"layout: {layout_name} (data.layout=auto" in caplog.text
    # 20 steps move the loss by more than twice the band (a bf16 run that did not train would fail it), and
    # bf16 changed the numbers
    assert (first32 - last32) / last32 > 0.04
    assert last16 != last32
    assert abs(last16 - last32) / last32 <= 0.02, (last16, last32)
    assert module32.lean.active is lean and module16.lean.active is lean
    assert module16.trainer.precision == "bf16-mixed"
    assert {p.dtype for p in module16.model.parameters()} == {__import__("torch").float32}


@pytest.mark.parametrize(
    "layout", [pytest.param(k, marks=pytest.mark.slow) if k != "packed_per_batch" else k for k in LAYOUTS]
)
def test_bf16_true_trains_bfloat16_weights_to_the_end(tmp_path, files, layout):
    import torch

    overrides, _, lean = LAYOUTS[layout]
    first, last, module = run(tmp_path, (*overrides, data_path(files, layout)), "bf16-true")
    assert {p.dtype for p in module.model.parameters()} == {torch.bfloat16}
    assert module.lean.active is lean
    assert torch.isfinite(torch.tensor(last)) and last < first
