"""``python -m hf_lightning.evaluate ckpt_path=RUN/checkpoints/last.ckpt`` (or ``ckpt_path=last
hydra.run.dir=RUN``, or ``model.name_or_path=RUN/hf_model``).

Evaluates a trained model on its validation data, or on all of ``data.path``, prints a metrics table and
writes ``eval_metrics.json`` and ``predictions.jsonl`` (one line per example, in dataset order) into the
output folder. A line holds one reply (``prompt``, ``reference`` and, with ``generate=true``, the greedy
``reply``: :func:`prompt_and_reference`) and the teacher-forced record of every target of the row
(``positions``, ``predicted_ids``, ``label_ids``: every assistant turn of a chat, what ``val/loss`` scores);
the reference's tokens are ``label_ids`` up to the first gap in ``positions``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from hf_lightning.cli.process import hide_library_warnings
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import ConfigError, HFLightningError

log = logging.getLogger("hf_lightning.evaluate")


def prompt_and_reference(row: dict[str, Any], causal: bool) -> tuple[list[int], list[int]]:
    """``(prompt ids, reference ids)`` of a tokenized row: for a causal LM the prompt is every token before
    the first trained-on label (position >= 1) and the reference the run of trained-on tokens that starts
    there, up to the next untrained one: one reply, as ``generate=true`` makes one (a chat's first assistant
    turn; a completion; the rest of a text row); for an encoder-decoder model the source and the target."""
    ids = list(row["input_ids"])
    labels = row.get("labels")
    labels = list(labels) if isinstance(labels, (list, tuple)) else None
    if not causal:
        return ids, [t for t in (labels or []) if t != IGNORE_INDEX]
    labels = labels if labels is not None else ids
    first = next((i for i, t in enumerate(labels) if t != IGNORE_INDEX and i > 0), len(ids))
    end = next((i for i in range(first, len(labels)) if labels[i] == IGNORE_INDEX), len(labels))
    return ids[:first], labels[first:end]


def generate_replies(
    module: Any, prompts: list[list[int]], max_new_tokens: int, batch_size: int
) -> list[str]:
    """Greedy replies (``do_sample=False``), ``batch_size`` prompts at a time, left-padded with an attention
    mask as HF ``Seq2SeqTrainer``'s ``predict_with_generate`` batches them; the reply is the text after the
    prompt (skip_special_tokens). Equal to generating one prompt at a time (tested)."""
    import torch

    tok, model = module.tokenizer, module.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = next(model.parameters()).device
    decoder_only = not getattr(model.config, "is_encoder_decoder", False)
    model.eval()
    replies: list[str] = []
    with torch.no_grad():
        for start in range(0, len(prompts), max(batch_size, 1)):
            chunk = prompts[start : start + max(batch_size, 1)]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            new = out[:, width:] if decoder_only else out
            replies.extend(tok.decode(row, skip_special_tokens=True) for row in new)
    return replies


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate and predict; returns the metrics.

    The objects come from :func:`hf_lightning.config.build.build` (``purpose="evaluate"``), as training builds
    them: ``module.*`` (the loss settings), ``trainer.precision`` and ``trainer.accelerator`` are honoured;
    one device (more is refused in one line).

    ``ckpt_path`` is resolved as training resolves it
    (:func:`~hf_lightning.checkpointing.resume.resolve_ckpt_path`): ``last`` is ``last.ckpt`` of the run's
    checkpoint folder (``hydra.run.dir=RUN``, or ``callbacks.model_checkpoint.dirpath``), else its newest
    intact checkpoint; only the weights are read.

    Raises:
        ConfigError: neither ``model.name_or_path`` nor ``ckpt_path`` (random weights: nothing to evaluate); a
            ``ckpt_path`` that names no intact checkpoint (the message names the file and the newest intact
            one).
        HFLightningError: bad input (the message names the key, file or field).
    """
    from hf_lightning.checkpointing.resume import resolve_ckpt_path
    from hf_lightning.checkpointing.weights import load_model_weights
    from hf_lightning.config.build import build
    from hf_lightning.run.folder import check_checkpoint_of_run, checkpoint_dir

    out_dir = cfg.output_dir
    # `last` as train reads it: the run folder's (or callbacks.model_checkpoint.dirpath's) newest checkpoint
    ckpt_path = resolve_ckpt_path(
        cfg.ckpt_path or None,
        os.path.abspath(out_dir),
        checkpoint_dir(cfg, out_dir),
        purpose="evaluate",
    )
    # the checkpoint of the run whose folder the results go into, with that run's model settings
    check_checkpoint_of_run(os.path.abspath(out_dir), ckpt_path, cfg, checkpoint_dir(cfg, out_dir))
    run = build(cfg, "evaluate")  # its refusals first: they name what else is wrong
    if not ckpt_path and cfg.model.get("name_or_path") is None:
        raise ConfigError(
            "nothing trained to evaluate: model.name_or_path is null and no ckpt_path is given, so the model "
            "would be the experiment's randomly initialised one; set model.name_or_path=RUN/hf_model or "
            "ckpt_path=RUN/checkpoints/last.ckpt (with the run's overrides)"
        )
    trainer, datamodule, module = run.trainer, run.datamodule, run.module
    if ckpt_path:
        step = load_model_weights(module, ckpt_path, cfg.model.get("name_or_path"))
        log.info("evaluating the weights of %s (optimizer step %d)", ckpt_path, step)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    batches = trainer.predict(module, dataloaders=datamodule.predict_dataloader())
    rows = [row for batch in batches for row in batch]
    examples = datamodule.val_dataset.select(range(len(rows)))
    pairs = [prompt_and_reference(example, module.causal) for example in examples]
    replies = (
        generate_replies(
            module, [p for p, _ in pairs], cfg.max_new_tokens, cfg.data.per_device_eval_batch_size
        )
        if cfg.generate
        else None
    )
    os.makedirs(out_dir, exist_ok=True)
    decode = run.tokenizer.decode
    with open(os.path.join(out_dir, "predictions.jsonl"), "w", encoding="utf-8") as fh:
        for i, row in enumerate(rows):
            prompt, reference = pairs[i]
            record = {
                "index": i,
                "prompt": decode(prompt, skip_special_tokens=True),
                "reference": decode(reference, skip_special_tokens=True),
            }
            if replies is not None:
                record["reply"] = replies[i]
            record.update(row)
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
    from hf_lightning.cli.output import report_error

    hide_library_warnings()
    try:
        evaluate(cfg)
    except HFLightningError as err:
        from hf_lightning.run.lock import discard_new_run_folder

        report_error(err, log)  # once on stderr, and in the log file
        discard_new_run_folder(cfg.output_dir)  # a refused command leaves no folder it made
        sys.exit(2)


if __name__ == "__main__":
    from hf_lightning.cli.output import quiet_known_noise

    quiet_known_noise()
    from hf_lightning.config.typos import exit_on_misspelt_override

    sys.argv[1:] = exit_on_misspelt_override(sys.argv[1:], "evaluate", "evaluate")
    main()
