"""Model weights from a Lightning checkpoint into a built model, refused when they do not fit.

``load_state_dict(strict=False)`` alone would leave every missing layer at its random init and say nothing (a
checkpoint of a 2-layer run evaluated with a 3-layer model folder scored as if it were that run's model); a
shape mismatch would end in a raw ``RuntimeError``. Both become one
:class:`~hf_lightning.core.errors.ModelError` naming the checkpoint, the model folder and the first keys at
fault.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hf_lightning.core.errors import ConfigError, ModelError, UnsafeCheckpointError

MODEL_PREFIX = "model."  # HFLightningModule keeps the HF model under .model


def weights_mismatch_message(ckpt_path: str, model_path: Any, details: str) -> str:
    """The one-line refusal for a checkpoint whose weights do not fit the model built from ``model_path``."""
    return (
        f"ckpt_path={ckpt_path}: its weights do not fit the model of model.name_or_path={model_path} "
        f"({details}); use the model.name_or_path (and model.* overrides) of the run that wrote the "
        "checkpoint"
    )


def summarize_load_error(err: BaseException) -> str:
    """``load_state_dict``'s RuntimeError in a few words: per kind of problem, the count and the first
    keys."""
    parts = []
    for line in str(err).splitlines()[1:]:
        line = line.strip().rstrip(".")
        if not line:
            continue
        kind, sep, rest = line.partition(": ")
        keys = (
            [k.strip().strip('"') for k in rest.split(", ")] if sep and kind.endswith("in state_dict") else []
        )
        if keys:
            parts.append(f"{kind}: {len(keys)}, e.g. {keys[:3]}")
        elif len(parts) < 3:
            parts.append(line[:200])  # "size mismatch for KEY: ... shape ... shape ..."
    return "; ".join(parts) or str(err).splitlines()[0][:200]


def key_problems(missing: list[str], unexpected: list[str]) -> str:
    """``N weights missing from the checkpoint, e.g. [...]; M checkpoint weights the model has no place for,
    e.g. [...]`` (either part only when it has keys)."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing from the checkpoint, e.g. {missing[:3]}")
    if unexpected:
        parts.append(
            f"{len(unexpected)} checkpoint weights the model has no place for, e.g. {unexpected[:3]}"
        )
    return "; ".join(parts)


def load_model_weights(module: torch.nn.Module, ckpt_path: str, model_path: Any) -> int:
    """Load the ``model.*`` weights of the Lightning checkpoint ``ckpt_path`` into ``module``.

    Keys outside ``model.`` (metric states, extra state) may be absent or extra; every model weight must be
    present, known and of the same shape.

    Returns:
        The checkpoint's ``global_step`` (``-1`` when it has none).

    Raises:
        ConfigError: not a file, not a Lightning checkpoint (no ``state_dict``), or damaged (its ``.sha256``
            does not match).
        UnsafeCheckpointError: the file (or a sharded folder's ``meta.pt``, index or DeepSpeed states) names
            a pickled type outside the allow-list of :mod:`~hf_lightning.checkpointing.safe_load`; nothing of
            it is unpickled.
        ModelError: model weights missing, unexpected or of another shape (names the first few).

    A sharded checkpoint folder (``strategy=fsdp``) loads through ``torch.distributed.checkpoint`` into a
    module sharded or not (a collective when it is sharded: call it on every rank). A DeepSpeed checkpoint
    folder loads into a module that is not sharded: its partitions gathered into whole float32 weights by
    DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``.
    """
    from hf_lightning.checkpointing.io import checksum_problem
    from hf_lightning.checkpointing.sharded import is_deepspeed_checkpoint, is_sharded_checkpoint

    if is_sharded_checkpoint(str(ckpt_path)):
        if not is_deepspeed_checkpoint(str(ckpt_path)):
            return _load_sharded(module, str(ckpt_path), model_path)
        state = _deepspeed_state(str(ckpt_path))
    else:
        problem = checksum_problem(str(ckpt_path)) if os.path.isfile(str(ckpt_path)) else None
        if problem:
            raise ConfigError(f"ckpt_path={ckpt_path}: {ckpt_path} {problem}")
        from hf_lightning.checkpointing.safe_load import load_checkpoint_file

        try:
            state = load_checkpoint_file(ckpt_path)
        except FileNotFoundError:
            raise ConfigError(f"ckpt_path={ckpt_path}: no such file") from None
    if not isinstance(state, dict) or "state_dict" not in state:
        raise ConfigError(f"ckpt_path={ckpt_path}: not a Lightning checkpoint (no state_dict)")
    from hf_lightning.adapters.checkpoint import fill_frozen

    fill_frozen(module, state)  # an adapter checkpoint holds the trainable weights only
    try:
        result = module.load_state_dict(state["state_dict"], strict=False)
    except RuntimeError as err:  # shapes differ: torch lists them after its first line
        raise ModelError(weights_mismatch_message(ckpt_path, model_path, summarize_load_error(err))) from None
    missing = [k for k in result.missing_keys if k.startswith(MODEL_PREFIX)]
    unexpected = [k for k in result.unexpected_keys if k.startswith(MODEL_PREFIX)]
    if missing or unexpected:
        raise ModelError(weights_mismatch_message(ckpt_path, model_path, key_problems(missing, unexpected)))
    return int(state.get("global_step", -1))


def _deepspeed_state(path: str) -> dict[str, Any]:
    """``{"state_dict": whole float32 weights, "global_step": ...}`` of a DeepSpeed checkpoint folder, checked
    against its manifest first.

    Raises:
        ConfigError: the folder fails its manifest.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from hf_lightning.checkpointing.sharded import (
        check_deepspeed_states,
        deepspeed_client_state,
        folder_problem,
    )

    problem = folder_problem(path)
    if problem:
        raise ConfigError(f"ckpt_path={path}: {path} {problem}")
    check_deepspeed_states(path)  # zero_to_fp32 unpickles them without the weights-only restriction
    step = deepspeed_client_state(path).get("global_step", -1)
    return {"state_dict": get_fp32_state_dict_from_zero_checkpoint(path), "global_step": step}


def _load_sharded(module: torch.nn.Module, path: str, model_path: Any) -> int:
    """:func:`load_model_weights` for a checkpoint folder of a sharded run."""
    from hf_lightning.checkpointing.sharded import (
        folder_problem,
        load_sharded_weights,
        read_meta,
        shard_problem,
        stored_keys,
    )

    problem = folder_problem(path) or shard_problem(path)
    if problem:
        raise ConfigError(f"ckpt_path={path}: {path} {problem}")
    stored = {k.removeprefix("state_dict.") for k in stored_keys(path) if k.startswith("state_dict.")}
    wanted = [k for k in module.state_dict() if k.startswith(MODEL_PREFIX)]
    missing = [k for k in wanted if k not in stored]
    unexpected = sorted(k for k in stored if k.startswith(MODEL_PREFIX) and k not in set(wanted))
    if missing or unexpected:
        raise ModelError(weights_mismatch_message(path, model_path, key_problems(missing, unexpected)))
    try:
        load_sharded_weights(module, path)
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # DCP wraps a shape mismatch in its CheckpointException
        raise ModelError(weights_mismatch_message(path, model_path, str(err).splitlines()[0][:300])) from None
    return int(read_meta(path).get("global_step", -1))
