"""``metric_for_best_model`` / ``greater_is_better`` (HF ``TrainingArguments``) as Lightning's monitor and
mode."""

from __future__ import annotations

from hf_lightning.core.errors import ConfigError
from hf_lightning.module.schedules import metric_key


def resolve_monitor(metric_for_best_model: str, greater_is_better: bool | None = None) -> tuple[str, str]:
    """Map an HF metric name to ``(monitor, mode)`` for ``ModelCheckpoint`` / ``EarlyStopping``.

    HF names are accepted as users write them: ``loss``, ``eval_loss``, ``eval_accuracy`` become
    ``val/loss``, ``val/accuracy``; ``val/...`` and ``test/...`` names pass through. A name ending in
    ``loss`` defaults to ``mode="min"``; any other name needs ``greater_is_better`` set explicitly (HF
    guesses ``True``, which silently keeps the worst model for an error-rate metric).

    Raises:
        ConfigError: an empty name, or a non-loss metric without ``greater_is_better``.
    """
    if not metric_for_best_model:
        raise ConfigError(
            "metric_for_best_model is empty; name a logged metric such as eval_loss or val/accuracy"
        )
    name = metric_key(metric_for_best_model)
    if greater_is_better is None:
        if not name.endswith("loss"):
            raise ConfigError(
                f"metric_for_best_model={metric_for_best_model!r} does not end in 'loss': set "
                "greater_is_better to true or false, so the best checkpoint is not chosen in the wrong "
                "direction"
            )
        greater_is_better = False
    return name, "max" if greater_is_better else "min"
