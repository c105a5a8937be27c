"""Every experiment file runs for two optimizer steps (in process, CPU) and leaves a loadable HF export.

Parametrized over ``conf/experiment/``: an experiment without data below fails, so none can rot.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from hf_lightning.config.compose import CONF_DIR

pytestmark = pytest.mark.slow

EXPERIMENTS = sorted(p.stem for p in Path(CONF_DIR, "experiment").glob("*.yaml"))


def _first_lines(src: str, dst: Path, n: int) -> Path:
    with open(src) as fh, open(dst, "w") as out:
        for _ in range(n + 1):
            out.write(fh.readline())
    return dst


def data_overrides(experiment: str, shared: str, tmp_path: Path) -> list[str]:
    if experiment == "sft":
        return []  # the embedded chatterbot-corpus conversations
    if experiment == "clm":
        return [f"data.path={shared}/c4-demo/c4_demo.jsonl", "data.max_length=64"]
    if experiment == "classification":
        # banking77 as it ships: a `text,category` CSV; 200 rows keep the test short
        train = _first_lines(f"{shared}/banking77/train.csv", tmp_path / "train.csv", 200)
        test = _first_lines(f"{shared}/banking77/test.csv", tmp_path / "test.csv", 40)
        return [f"data.path={train}", f"data.validation_path={test}"]
    if experiment == "seq2seq":
        pairs = tmp_path / "pairs.jsonl"
        with open(f"{shared}/gsm8k/train.jsonl") as fh, open(pairs, "w") as out:
            for line, _ in zip(fh, range(64)):
                row = json.loads(line)
                out.write(json.dumps({"source": row["question"], "target": row["answer"]}) + "\n")
        return [f"data.path={pairs}", "data.max_length=128"]
    raise AssertionError(f"experiment {experiment!r} has no test data: add it to data_overrides")


def _skip_unless_format(fmt: str) -> None:
    from hf_lightning.core.errors import ConfigError
    from hf_lightning.data import HFDataModule

    class _Tok:
        pad_token_id = 0

    try:
        HFDataModule(tokenizer=_Tok(), format=fmt)
    except ConfigError as err:
        if f"data.format={fmt!r}" in str(err):
            pytest.skip(f"needs the {fmt!r} format and collator of HFDataModule: {err}")
        raise


def _classification_loss_is_cross_entropy() -> bool:
    """Probe (no mock): does ``HFLightningModule.compute_loss`` give a sequence classifier's cross-entropy?"""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hf_lightning.module import HFLightningModule

    torch.manual_seed(0)
    model = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_labels=3,
            pad_token_id=0,
        )
    )
    labels = torch.tensor([0, 2, 1])
    batch = {
        "input_ids": torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]),
        "attention_mask": torch.ones(3, 3, dtype=torch.long),
        "labels": labels,
    }
    try:
        loss, outputs = HFLightningModule(model).compute_loss(batch, torch.tensor(3))
    except Exception:
        return False
    expected = torch.nn.functional.cross_entropy(outputs.logits.float(), labels)
    return bool(torch.allclose(loss, expected, rtol=1e-5))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_two_steps(experiment, compose_cfg, shared_data, tmp_path):
    from hf_lightning.train import train

    cfg = compose_cfg(f"+experiment={experiment}", *data_overrides(experiment, shared_data, tmp_path))
    if cfg.data.format in ("classification", "seq2seq"):
        _skip_unless_format(cfg.data.format)
    if cfg.model.task == "sequence_classification" and not _classification_loss_is_cross_entropy():
        pytest.skip(
            "needs the sequence-classification loss of HFLightningModule: compute_loss "
            "treats 1-D class labels as causal tokens (shifted), so the classifier's loss is not its "
            "cross-entropy"
        )
    metrics, objects = train(cfg)

    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) and v > 0 for v in losses.values())
    assert objects["trainer"].global_step == 2
    assert math.isfinite(metrics["val/loss"])
    saved = json.loads((tmp_path / "final_metrics.json").read_text())
    assert saved["train/loss"] == pytest.approx(losses[2]) and saved["global_step"] == 2

    import transformers

    from hf_lightning.models.loading import TASKS

    auto = getattr(transformers, TASKS[cfg.model.task])
    exported = auto.from_pretrained(tmp_path / "hf_model")
    assert type(exported).__name__ == type(objects["module"].model).__name__
    assert os.path.isfile(tmp_path / "hf_model" / "tokenizer_config.json")
    if experiment == "classification":
        with open(tmp_path / "train.csv") as fh:
            categories = {r["category"] for r in csv.DictReader(fh)}
        # one class per category of the data, names kept in the export
        assert set(exported.config.id2label.values()) == categories
        # the logged validation loss is the exported model's mean cross-entropy over the validated rows
        import torch
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tmp_path / "hf_model")
        with open(tmp_path / "test.csv") as fh:
            # validation runs in dataset order over trainer.limit_val_batches batches
            rows = list(csv.DictReader(fh))[
                : cfg.trainer.limit_val_batches * cfg.data.per_device_eval_batch_size
            ]
        label2id = {v: int(k) for k, v in exported.config.id2label.items()}
        enc = tok(
            [r["text"] for r in rows],
            truncation=True,
            max_length=cfg.data.max_length,
            padding=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            logits = exported.eval()(**enc).logits
        expected = torch.nn.functional.cross_entropy(
            logits, torch.tensor([label2id[r["category"]] for r in rows])
        )
        assert metrics["val/loss"] == pytest.approx(expected.item(), rel=1e-4)


def _step_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")}


def test_precision_and_fused_adamw_knobs(compose_cfg, tmp_path):
    """bf16 autocast on the CPU tracks the fp32 run within bf16 tolerance; optim.fused reaches the optimizer
    (null: the fused kernel where it takes the parameters, the CPU included; false: the foreach kernel)."""
    from hf_lightning.train import train

    common = ("+experiment=sft", "callbacks=none", "trainer.limit_val_batches=0", "scheduler.warmup_steps=0")
    _, fp32 = train(compose_cfg(*common))
    fp32_losses = _step_losses(tmp_path)
    assert fp32["trainer"].optimizers[0].defaults["fused"] is True
    # a second run in the same folder: clear the first one (Lightning's default checkpoint lands there too)
    (tmp_path / "metrics.csv").unlink()
    shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)

    _, bf16 = train(compose_cfg(*common, "trainer.precision=bf16-mixed", "optim.fused=false"))
    bf16_losses = _step_losses(tmp_path)
    assert bf16["trainer"].precision == "bf16-mixed"
    assert not bf16["trainer"].optimizers[0].defaults["fused"]
    assert sorted(bf16_losses) == sorted(fp32_losses) == [1, 2]
    for step, value in fp32_losses.items():
        assert bf16_losses[step] == pytest.approx(value, rel=3e-2)
    assert bf16_losses[1] != fp32_losses[1]  # autocast really ran in bf16
