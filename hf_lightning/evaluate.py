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
from omegaconf import DictConfig

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
    """Validate and predict; returns the metrics.

    The objects come from :func:`hf_lightning.config.build.build` (``purpose="evaluate"``), as training builds
    them: ``module.*`` (the loss settings), ``trainer.precision`` and ``trainer.accelerator`` are honoured; one
    device (more is refused in one line).

    Raises:
        HFLightningError: bad input (the message names the key, file or field).
    """
    from hf_lightning.checkpointing.weights import load_model_weights
    from hf_lightning.config.build import build

    out_dir = cfg.output_dir
    if cfg.ckpt_path and not os.path.isfile(cfg.ckpt_path):
        raise ConfigError(f"ckpt_path={cfg.ckpt_path}: no such file")
    run = build(cfg, "evaluate")
    trainer, datamodule, module = run.trainer, run.datamodule, run.module
    if cfg.ckpt_path:
        step = load_model_weights(module, cfg.ckpt_path, cfg.model.get("name_or_path"))
        log.info("evaluating the weights of %s (optimizer step %d)", cfg.ckpt_path, step)
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
