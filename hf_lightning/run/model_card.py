"""``hf_model/README.md``: the exported model's card, as HF ``Trainer.create_model_card`` writes it.

Built by transformers' own ``transformers.modelcard.TrainingSummary`` (a public dataclass: HF's
``create_model_card`` fills it from a ``Trainer`` with ``TrainingSummary.from_trainer``; here it is filled
from the run's config and final metrics) and rendered by its ``to_model_card``: the YAML metadata block
(``library_name``, ``license`` where the hub names the base model's, ``base_model``, ``tags``, ``datasets``
for a hub dataset, ``metrics`` and ``model-index``), then HF's sections: the results on the evaluation set,
the training hyperparameters under HF's names (``extract_hyperparameters_from_trainer``'s), the results table
of every validation (``parse_log_history``'s columns) and the framework versions, with Lightning's added.

HF's rules, kept: ``base_model`` is the model's hub id (a local folder is not named), ``datasets`` only a hub
dataset id (a local file is named in the text only), the task from the model class (``TASK_MAPPING``), the
model name from the output folder's name, ``generated_from_trainer`` among the tags (``hf_lightning`` too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
# HF's defaults for the optimizer line (TrainingArguments' adam_beta1/2, adam_epsilon)
_BETAS, _EPS = (0.9, 0.999), 1e-8
# our optimizer names that HF spells otherwise (module/optim.py: adamw is torch's AdamW, HF's adamw_torch)
_HF_OPTIM = {"adamw": "adamw_torch"}


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "get") else None
    return default if node is None else node


def hyperparameters(cfg: Any, world_size: int, accelerator: str = "cpu") -> dict[str, Any]:
    """The run's training settings under HF's names, in HF's order and with HF's omissions
    (``transformers.modelcard.extract_hyperparameters_from_trainer``).

    Args:
        cfg: the composed config (``optim``, ``scheduler``, ``data``, ``trainer``, ``module``, ``seed``).
        world_size: data-parallel ranks.
        accelerator: the device type (``cuda`` names HF's ``multi-GPU``).
    """
    train_bs = int(_get(cfg, "data.per_device_train_batch_size", 8))
    eval_bs = int(_get(cfg, "data.per_device_eval_batch_size", train_bs))
    accumulation = int(_get(cfg, "data.gradient_accumulation_steps", 1) or 1)
    params: dict[str, Any] = {
        "learning_rate": float(_get(cfg, "optim.lr")),
        "train_batch_size": train_bs,
        "eval_batch_size": eval_bs,
        "seed": _get(cfg, "seed"),
    }
    if world_size > 1:
        params["distributed_type"] = "multi-GPU" if accelerator == "cuda" else f"multi-{accelerator.upper()}"
        params["num_devices"] = world_size
    if accumulation > 1:
        params["gradient_accumulation_steps"] = accumulation
    if train_bs * world_size * accumulation != train_bs:
        params["total_train_batch_size"] = train_bs * world_size * accumulation
    if eval_bs * world_size != eval_bs:
        params["total_eval_batch_size"] = eval_bs * world_size
    name = str(_get(cfg, "optim.name", "adamw"))
    name = _HF_OPTIM.get(name, name)
    kwargs = dict(_get(cfg, "optim.kwargs", {}) or {})
    args = ",".join(f"{k}={v}" for k, v in kwargs.items()) or "No additional optimizer arguments"
    if "adam" in name.lower():
        betas = tuple(_get(cfg, "optim.betas") or _BETAS)
        eps = _get(cfg, "optim.eps")
        eps = _EPS if eps is None else eps
        params["optimizer"] = (
            f"Use {name} with betas=({betas[0]},{betas[1]}) and epsilon={eps} and optimizer_args={args}"
        )
    else:
        params["optimizer"] = f"Use {name} and the args are:\n{args}"
    params["lr_scheduler_type"] = _get(cfg, "scheduler.name", "linear")
    warmup = _get(cfg, "scheduler.warmup_steps") or _get(cfg, "scheduler.warmup_ratio") or 0
    if warmup:
        params["lr_scheduler_warmup_steps"] = warmup
    max_steps = _get(cfg, "trainer.max_steps", -1)
    if max_steps is not None and int(max_steps) != -1:
        params["training_steps"] = int(max_steps)
    else:
        params["num_epochs"] = _get(cfg, "trainer.max_epochs")
    if str(_get(cfg, "trainer.precision", "")).startswith("16"):
        params["mixed_precision_training"] = "Native AMP"
    smoothing = float(_get(cfg, "module.label_smoothing_factor", 0.0) or 0.0)
    if smoothing:
        params["label_smoothing_factor"] = smoothing
    return params


def _title(key: str) -> str:
    """HF's column name of a metric: ``val/mean_token_accuracy`` -> ``Mean Token Accuracy``."""
    return " ".join(part.capitalize() for part in key.split("/", 1)[-1].split("_"))


def evaluation_results(metrics: Mapping[str, float]) -> dict[str, float] | None:
    """The final ``val/*`` metrics under HF's names (``eval_loss`` -> ``Loss``); ``None`` without any."""
    results = {_title(k): float(v) for k, v in metrics.items() if k.startswith("val/")}
    return results or None


def evaluation_lines(csv_path: str) -> list[dict[str, Any]] | None:
    """One row per validation in ``metrics.csv``, HF's ``parse_log_history`` columns: ``Training Loss`` (the
    newest train row's, ``No log`` before the first), ``Epoch``, ``Step``, ``Validation Loss``, then the other
    ``val/*`` metrics."""
    from hf_lightning.run.loggers import read_rows

    if not os.path.isfile(csv_path):
        return None
    lines, train_loss, epoch = [], "No log", None
    for row in read_rows(csv_path)[1]:
        cells = {k: v for k, v in row.items() if v not in ("", None)}
        if "train/loss" in cells:
            train_loss = float(cells["train/loss"])
        if "epoch" in cells:
            epoch = float(cells["epoch"])
        if "val/loss" not in cells:
            continue
        step = int(float(cells["step"]))
        line: dict[str, Any] = {"Training Loss": train_loss, "Epoch": epoch, "Step": step}
        line["Validation Loss"] = float(cells["val/loss"])
        others = {k: v for k, v in cells.items() if k.startswith("val/") and k != "val/loss"}
        line.update({_title(k): float(v) for k, v in others.items()})
        lines.append(line)
    return lines or None


def _task(model: Any) -> str | None:
    from transformers.modelcard import TASK_MAPPING

    name = type(model).__name__
    for task, mapping in TASK_MAPPING.items():
        if name in set(mapping.values()) or any(name in v for v in mapping.values() if isinstance(v, tuple)):
            return task
    return None


def model_card(
    cfg: Any,
    model: Any,
    metrics: Mapping[str, float],
    world_size: int = 1,
    accelerator: str = "cpu",
    csv_path: str | None = None,
) -> str:
    """The card's text (``TrainingSummary.to_model_card``).

    Args:
        cfg: the composed config of the run.
        model: the trained HF model (its class names the task; a peft model's base class counts).
        metrics: the final metrics (``final_metrics.json``'s).
        world_size, accelerator: the run's data-parallel ranks and device type.
        csv_path: the run's ``metrics.csv`` (the results table); ``None``: no table.
    """
    import lightning
    from transformers.modelcard import TrainingSummary

    from hf_lightning.models.hub import looks_like_hub_id

    base = _get(cfg, "model.name_or_path")
    base = str(base) if base and not os.path.isdir(str(base)) and looks_like_hub_id(str(base)) else None
    data = _get(cfg, "data.path")
    hub_data = data and not os.path.exists(str(data)) and looks_like_hub_id(str(data))
    dataset = [str(data)] if hub_data else [os.path.basename(str(data).rstrip("/"))] if data else None
    if data is None:
        dataset = ["chatterbot-corpus"]  # the embedded default (hf_lightning/defaults.py)
    output_dir = str(_get(cfg, "output_dir", "") or "")
    inner = getattr(model, "get_base_model", lambda: model)()
    summary = TrainingSummary(
        model_name=os.path.basename(output_dir.rstrip("/")) or (base or "model"),
        tags=["hf_lightning", "generated_from_trainer"],
        finetuned_from=base,
        tasks=_task(inner),
        dataset=dataset,
        dataset_tags=[str(data)] if hub_data else None,
        eval_results=evaluation_results(metrics),
        eval_lines=evaluation_lines(csv_path) if csv_path else None,
        hyperparameters=hyperparameters(cfg, world_size, accelerator),
    )
    return summary.to_model_card() + f"- Lightning {lightning.__version__}\n"


def write_model_card(cfg: Any, trainer: Any, model: Any, metrics: Mapping[str, float]) -> str | None:
    """Write ``README.md`` into the run's export folder (the ``HFExport`` callback's ``dirpath``) on rank 0;
    the path written, or ``None`` when there is no export folder (no ``HFExport``, or nothing exported)."""
    from hf_lightning.callbacks.hf_export import HFExport
    from hf_lightning.checkpointing.files import atomic_file

    if not trainer.is_global_zero:
        return None
    export = next((c for c in trainer.callbacks if isinstance(c, HFExport)), None)
    if export is None or not os.path.isdir(export.dirpath):
        return None
    accelerator = getattr(getattr(trainer.strategy, "root_device", None), "type", "cpu")
    csv_path = os.path.join(str(_get(cfg, "output_dir", "")), "metrics.csv")
    text = model_card(cfg, model, metrics, trainer.world_size, accelerator, csv_path)
    path = os.path.join(export.dirpath, CARD_FILE)
    with atomic_file(path, "w") as fh:
        fh.write(text)
    log.info("wrote the model card %s", path)
    return path
