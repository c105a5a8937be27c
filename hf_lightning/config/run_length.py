"""HF's run-length rule on the command line: a given ``trainer.max_steps`` wins over an epoch count nobody
gave.

HF ``TrainingArguments.max_steps`` "overrides ``num_train_epochs``"; Lightning stops at whichever of
``max_steps`` and ``max_epochs`` comes first. Our configs set an epoch count (``trainer: max_epochs: 1``, an
experiment's ``max_epochs``), so without this rule ``+experiment=clm trainer.max_steps=12`` on a 10-step epoch
would stop at step 10. Only the command line says what the user gave: Hydra's ``overrides.task``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)

MAX_STEPS = "trainer.max_steps"
MAX_EPOCHS = "trainer.max_epochs"


def given_keys(overrides: Iterable[str]) -> set[str]:
    """The config keys a list of Hydra overrides sets or deletes (``a.b=1``, ``+a.b=1``, ``++a.b=1``,
    ``~a.b``); a group choice (``trainer=debug``) names the group, not the keys its file sets."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))}


def command_line_overrides() -> list[str] | None:
    """This Hydra job's command-line overrides (``hydra.overrides.task``), or ``None`` outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def apply_max_steps_precedence(cfg: DictConfig, overrides: Iterable[str] | None) -> bool:
    """Unset ``trainer.max_epochs`` when the overrides give ``trainer.max_steps`` (a limit, not -1) and not
    ``trainer.max_epochs``, with one INFO line; returns whether it did. ``overrides=None`` (no command line:
    ``train(cfg)`` called from Python) changes nothing. Both given: both stay, and Lightning stops at the
    first one reached (:meth:`~hf_lightning.HFLightningModule.total_training_steps` warns when that is the
    epochs).
    """
    if overrides is None:
        return False
    given = given_keys(overrides)
    steps, epochs = cfg.trainer.get("max_steps"), cfg.trainer.get("max_epochs")
    if MAX_STEPS not in given or MAX_EPOCHS in given or steps in (None, -1) or epochs in (None, -1):
        return False
    with open_dict(cfg):
        cfg.trainer.max_epochs = None  # Lightning: no epoch limit when max_steps is set
    log.info(
        "%s=%s (given) overrides %s=%s (not given): the run ends at step %s, as HF's max_steps overrides "
        "num_train_epochs (give %s too to stop at whichever comes first)",
        MAX_STEPS,
        steps,
        MAX_EPOCHS,
        epochs,
        steps,
        MAX_EPOCHS,
    )
    return True
