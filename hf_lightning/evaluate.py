"""``python -m hf_lightning.evaluate ckpt_path=RUN/checkpoints/last.ckpt`` (or ``model.name_or_path=RUN/hf_model``).

Evaluates a trained model on its validation data, or on all of ``data.path``, prints a metrics table and writes
``eval_metrics.json`` and ``predictions.jsonl`` (one line per example, in dataset order) into the output folder.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hf_lightning.cli import hide_library_warnings
from hf_lightning.errors import ConfigError, HFLightningError

log = logging.getLogger("hf_lightning.evaluate")


def generate_replies(module: Any, dataset: Any, max_new_tokens: int) -> list[str]:
    """Greedy reply per example; the prompt is every token before the first trained-on label."""
    import torch

    tok, model = module.tokenizer, module.model
    model.eval()
    replies = []
    with torch.no_grad():
        for row in dataset:
            ids, labels = row["input_ids"], row.get("labels") or row["input_ids"]
            first = next((i for i, t in enumerate(labels) if t != -100 and i > 0), len(ids))
            prompt = torch.tensor([ids[:first]])
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            replies.append(tok.decode(out[0, prompt.shape[1] :], skip_special_tokens=True))
    return replies


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate and predict; returns the metrics. Raises :class:`HFLightningError` on bad input."""
    import lightning as L

    from hf_lightning.adapters import apply_adapters
    from hf_lightning.adapters.settings import adapter_settings
    from hf_lightning.checkpointing.weights import load_model_weights
    from hf_lightning.data import HFDataModule
    from hf_lightning.models import load_model_and_tokenizer
    from hf_lightning.module import HFLightningModule

    out_dir = cfg.output_dir
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # a base built from a config: the run's init
    model, tokenizer = load_model_and_tokenizer(**model_cfg)
    adapters = adapter_settings(OmegaConf.to_container(cfg.peft, resolve=True) if cfg.get("peft") else None)
    if (
        adapters is not None
    ):  # the checkpoint of a peft run holds the adapter: build the same adapter to load it
        model = apply_adapters(model, adapters, model_cfg.get("task", "causal_lm"))
    data_kwargs = OmegaConf.to_container(cfg.data, resolve=True)
    if data_kwargs.get("path") == "???":
        raise ConfigError("data.path is required by this experiment: the file to evaluate on")
    if data_kwargs.get("path") is not None:
        data_kwargs["validation_path"] = data_kwargs["path"]
    data_kwargs.update(group_by_length=False, packing=False)
    datamodule = HFDataModule(tokenizer=tokenizer, **data_kwargs)
    module = HFLightningModule(model, tokenizer=tokenizer)
    if cfg.ckpt_path:
        if not os.path.isfile(cfg.ckpt_path):
            raise ConfigError(f"ckpt_path={cfg.ckpt_path}: no such file")
        step = load_model_weights(module, cfg.ckpt_path, model_cfg.get("name_or_path"))
        log.info("evaluating the weights of %s (optimizer step %d)", cfg.ckpt_path, step)
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=cfg.trainer.get("limit_val_batches"),
        limit_predict_batches=cfg.trainer.get("limit_val_batches"),
        enable_progress_bar=cfg.trainer.get("enable_progress_bar", True),
        use_distributed_sampler=False,
    )
    trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    batches = trainer.predict(module, dataloaders=datamodule.predict_dataloader())
    rows = [row for batch in batches for row in batch]
    replies = (
        generate_replies(module, datamodule.val_dataset.select(range(len(rows))), cfg.max_new_tokens)
        if cfg.generate
        else None
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "predictions.jsonl"), "w", encoding="utf-8") as fh:
        for i, row in enumerate(rows):
            record = {"index": i, **row}
            if replies is not None:
                record["reply"] = replies[i]
            fh.write(json.dumps(record) + "\n")
    with open(os.path.join(out_dir, "eval_metrics.json"), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2)
    width = max(len(k) for k in metrics)
    print(
        "\n".join(
            [f"{'metric':<{width}}  value"] + [f"{k:<{width}}  {v:.6g}" for k, v in sorted(metrics.items())]
        )
    )
    log.info(
        "wrote %s and %s",
        os.path.join(out_dir, "eval_metrics.json"),
        os.path.join(out_dir, "predictions.jsonl"),
    )
    return metrics


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    hide_library_warnings()
    try:
        evaluate(cfg)
    except HFLightningError as err:
        log.error("%s", err)
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
