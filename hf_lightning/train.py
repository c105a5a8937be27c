"""``python -m hf_lightning.train +experiment=sft [overrides]``: fine-tune, evaluate, checkpoint, export.

``train(cfg)`` is a plain function (returns the final metrics and the objects it built); ``main`` is the thin
Hydra wrapper that turns input errors into one-line messages and returns the optimized metric to sweepers.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hf_lightning.errors import ConfigError, HFLightningError

log = logging.getLogger("hf_lightning.train")


def resolve_ckpt_path(ckpt_path: str | None, output_dir: str) -> str | None:
    """``last`` → ``<output_dir>/checkpoints/last.ckpt``; any path must exist.

    Raises:
        ConfigError: ``ckpt_path=last`` with no checkpoint in this run folder, or a path that does not exist.
    """
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        path = os.path.join(output_dir, "checkpoints", "last.ckpt")
        if not os.path.isfile(path):
            raise ConfigError(
                f"ckpt_path=last: no checkpoint at {path}. Resume needs the same run folder "
                "(hydra.run.dir=...); drop ckpt_path to start fresh"
            )
        return path
    if not os.path.isfile(ckpt_path):
        raise ConfigError(f"ckpt_path={ckpt_path}: no such file")
    return ckpt_path


def resolve_function(path: str, key: str) -> Any:
    """The function at a dotted ``path`` (``package.module.function``).

    Raises:
        ConfigError: the path does not name an importable callable (the message names ``key``).
    """
    from hydra.utils import get_method

    try:
        return get_method(path)
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an importable function ({err})") from err


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one training job described by ``cfg``.

    Returns:
        ``(metrics, objects)``: the final callback metrics as floats, and the built ``trainer``, ``module``,
        ``datamodule``.

    Raises:
        HFLightningError: bad config, data or model (the message names the key, file or field).
    """
    import lightning as L
    from hydra.utils import instantiate

    from hf_lightning.config_check import check_keys
    from hf_lightning.data import HFDataModule
    from hf_lightning.models import load_model_and_tokenizer
    from hf_lightning.module import HFLightningModule
    from hf_lightning.module.optim import build_optimizer, build_scheduler

    check_keys(cfg.data, HFDataModule.__init__, "data", skip=("tokenizer",))
    check_keys(cfg.model, load_model_and_tokenizer, "model")
    check_keys(cfg.optim, build_optimizer, "optim", skip=("model",))
    check_keys(cfg.scheduler, build_scheduler, "scheduler", skip=("optimizer", "num_training_steps"))
    check_keys(cfg.module, HFLightningModule.__init__, "module", skip=("model", "tokenizer", "optim", "scheduler"))
    if cfg.data.path == "???":
        raise ConfigError("data.path is required by this experiment: a json/jsonl/csv/parquet file or a save_to_disk folder")
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), cfg.output_dir)

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    model, tokenizer = load_model_and_tokenizer(**OmegaConf.to_container(cfg.model, resolve=True))
    datamodule = HFDataModule(tokenizer=tokenizer, **OmegaConf.to_container(cfg.data, resolve=True))
    module_kwargs = OmegaConf.to_container(cfg.module, resolve=True)
    if isinstance(module_kwargs.get("compute_loss_func"), str):
        module_kwargs["compute_loss_func"] = resolve_function(module_kwargs["compute_loss_func"], "module.compute_loss_func")
    module = HFLightningModule(
        model,
        tokenizer=tokenizer,
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True),
        **module_kwargs,
    )
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.2fM parameters", type(model).__name__, n_params / 1e6)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    wall = time.perf_counter() - start

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    tokens = module.trained_tokens()
    metrics.update({"parameters": float(n_params), "wall_time_s": wall, "train_tokens_per_s": tokens / wall})
    log.info(
        "done: %d optimizer steps, %.1f s, %.0f real tokens/s (this process), final %s",
        trainer.global_step, wall, tokens / wall,
        ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if "/" in k),
    )
    return metrics, {"trainer": trainer, "module": module, "datamodule": datamodule}


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics, _ = train(cfg)
    except HFLightningError as err:
        log.error("%s", err)
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)
    value = metrics.get(cfg.get("optimized_metric"))
    return value


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
