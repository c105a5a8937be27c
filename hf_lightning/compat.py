"""Every use of a private attribute of Lightning, transformers, datasets or torch, one function each.

Why one module: an upgrade of one of these libraries that renames or drops an internal then fails one named
test (``tests/unit/test_compat.py`` for Lightning's, ``tests/unit/test_compat_hf_torch.py`` for the others;
one test per function, run on the installed versions) instead of a user's run, and a reader sees in one file
what we rely on beyond the public API.
``tests/unit/test_private_access.py`` fails when a private library attribute appears anywhere else in
``hf_lightning/``.

Each function says what it reads, why no public API serves, and (where one exists) what it falls back to.
Versions read: lightning 2.6, transformers 5.24, datasets 5.2, torch 2.13.

Lightning is imported inside the functions that read it (and :class:`KeepingExperimentWriter` is made on
first use), never at the top: the data layer uses this module's ``datasets`` / ``transformers`` / ``torch``
functions, and a data-only process (``import hf_lightning.data``, a ``DataLoader`` worker) imports no trainer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

# ------------------------------------------ Lightning: evaluation results, the launcher, a module's trainer


def evaluation_results(loop: Any) -> list[dict[str, float]] | None:
    """The list ``trainer.validate()`` / ``trainer.test()`` will return, while the loop builds it
    (``_EvaluationLoop._logged_outputs``); ``None`` when the attribute is gone."""
    return getattr(loop, "_logged_outputs", None)


def uses_script_launcher(strategy: Any) -> bool:
    """Whether the strategy starts its other ranks with ``_SubprocessScriptLauncher`` (re-running
    ``sys.argv``; Lightning has no public flag for it)."""
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    return isinstance(getattr(strategy, "launcher", None), _SubprocessScriptLauncher)


def launcher_rank() -> int:
    """This process's global rank as the launcher set it (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``, ...), 0
    without one, read by Lightning's own ``lightning.fabric.utilities.rank_zero._get_rank`` (no public
    function reads the launcher's variables before a Trainer exists)."""
    from lightning.fabric.utilities.rank_zero import _get_rank

    return _get_rank() or 0


def attached_trainer(module: Any) -> Any:
    """``module.trainer``, or ``None`` for a LightningModule not attached to a ``Trainer`` (the public
    property raises then). No private attribute: the public property, its ``RuntimeError`` caught."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def epoch_batch_index(trainer: Any) -> int:
    """The index in the current epoch of the training batch being run (0-based), restored on a resume:
    ``trainer.fit_loop.epoch_loop.batch_idx``, the value Lightning passes to ``training_step`` as
    ``batch_idx`` (no public ``Trainer`` property; read in hooks that are not handed it)."""
    return int(trainer.fit_loop.epoch_loop.batch_idx)


# ------------------------------------------------------------------------------ Lightning: ModelCheckpoint


def save_last_checkpoint(callback: Any, trainer: Any) -> None:
    """Write ``last.ckpt`` now through the callback's own bookkeeping
    (``ModelCheckpoint._save_last_checkpoint`` with ``_monitor_candidates``, the path its ``on_train_end``
    takes): a ``trainer.save_checkpoint`` behind its back makes it write ``last-v1.ckpt`` beside an unknown
    ``last.ckpt`` later."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def last_saved_step(callback: Any) -> int:
    """The optimizer step a ``ModelCheckpoint`` saved last (``_last_global_step_saved``; -1 for any other
    callback)."""
    return getattr(callback, "_last_global_step_saved", -1)


def mark_saved_at(callback: Any, step: int) -> None:
    """Tell a ``ModelCheckpoint`` its saves of ``step`` are done (``_last_global_step_saved``; the counter is
    not in Lightning's checkpoint, so a resumed callback would save the same step again)."""
    callback._last_global_step_saved = step


def acts_after_every_validation(callback: Any) -> None:
    """Make a monitoring ``ModelCheckpoint`` or ``EarlyStopping`` act after every validation, not only at
    train epoch ends (``_save_on_train_epoch_end`` / ``_check_on_train_epoch_end`` = False: what their
    constructors' ``save_on_train_epoch_end`` / ``check_on_train_epoch_end`` set, which their own ``setup``
    fills in when ``None``). Any other callback is left alone."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    if isinstance(callback, ModelCheckpoint):
        callback._save_on_train_epoch_end = False
    elif isinstance(callback, EarlyStopping):
        callback._check_on_train_epoch_end = False


def stop_own_triggers(callback: Any) -> None:
    """Turn off a ``ModelCheckpoint``'s own periodic triggers (``_every_n_train_steps``, ``_every_n_epochs``,
    ``_train_time_interval``): another callback decides when it saves (:func:`save_checkpoint_now`)."""
    callback._every_n_train_steps = 0
    callback._every_n_epochs = 0
    callback._train_time_interval = None


def save_checkpoint_now(callback: Any, trainer: Any) -> None:
    """Save through a ``ModelCheckpoint`` now, as its own trigger would: unless it must skip
    (``_should_skip_saving_checkpoint``: a sanity check, not fitting, or saved at this step already), its
    top-k checkpoint and ``last.ckpt`` with the current monitor candidates (``_save_topk_checkpoint``,
    ``_save_last_checkpoint``, ``_monitor_candidates``)."""
    if callback._should_skip_saving_checkpoint(trainer):
        return
    candidates = callback._monitor_candidates(trainer)
    callback._save_topk_checkpoint(trainer, candidates)
    callback._save_last_checkpoint(trainer, candidates)


def saves_distributed_checkpoint(strategy: Any) -> bool:
    """Whether a ``ModelParallelStrategy`` writes checkpoint folders of shards
    (``_save_distributed_checkpoint``, its constructor's ``save_distributed_checkpoint``; no public
    property); ``True`` when the attribute is gone (Lightning's default)."""
    return bool(getattr(strategy, "_save_distributed_checkpoint", True))


# ------------------------------------------------------------------------------------- Lightning: CSVLogger


def _keeping_experiment_writer() -> type:
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    class KeepingExperimentWriter(ExperimentWriter):
        """Lightning's CSV ``ExperimentWriter`` that does not delete an existing ``metrics.csv`` when it
        starts: its private start-up check ``_check_log_dir_exists`` (warn, then delete the file) calls
        :meth:`found_metrics_file` instead, when the file exists."""

        def _check_log_dir_exists(self) -> None:
            if os.path.isfile(self.metrics_file_path):
                self.found_metrics_file()

        def found_metrics_file(self) -> None:
            """Called at start-up when ``metrics_file_path`` exists (a resumed run)."""

    KeepingExperimentWriter.__module__ = __name__
    return KeepingExperimentWriter


def __getattr__(name: str) -> Any:
    """``KeepingExperimentWriter``, a subclass of Lightning's ``ExperimentWriter``, made (and kept) on first
    use so that importing this module imports no Lightning."""
    if name == "KeepingExperimentWriter":
        cls = globals()[name] = _keeping_experiment_writer()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def csv_experiment(logger: Any, make_writer: Any) -> Any:
    """A ``CSVLogger``'s experiment writer, made by ``make_writer(log_dir)`` on first use (the body of
    ``CSVLogger.experiment`` with another writer: ``_experiment`` caches it, ``_fs`` creates the root
    folder)."""
    if logger._experiment is None:
        logger._fs.makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = make_writer(logger.log_dir)
    return logger._experiment


# ------------------------------------------------------------------------------------------------ DeepSpeed


def zero3_full_state_dict(engine: Any) -> dict[str, Any]:
    """The full 16-bit state dict of a ZeRO-3 ``DeepSpeedEngine``, gathered from every rank (a collective):
    ``_zero3_consolidated_16bit_state_dict()``, what ``save_16bit_model`` and HF ``Trainer`` use."""
    return engine._zero3_consolidated_16bit_state_dict()


@contextlib.contextmanager
def unwrap_without_deepspeed() -> Iterator[None]:
    """``save_pretrained`` without importing DeepSpeed when no DeepSpeed engine can exist.

    ``save_pretrained`` unwraps the model first (``transformers.modeling_utils.unwrap_model``), through
    accelerate's ``extract_model_from_parallel``, which imports ``deepspeed`` whenever the package is
    installed (``accelerate.utils.other.is_deepspeed_available``) to test for a ``DeepSpeedEngine``: seconds
    of start-up and DeepSpeed's accelerator log line, for a model that is not wrapped at all. When
    ``deepspeed`` was never imported in this process no engine exists, so for the duration of the block that
    check answers ``False`` and the unwrap skips the import (every other wrapper, compiled and DDP modules, is
    unwrapped as before). Unchanged when DeepSpeed is loaded or accelerate's module has no such name.
    """
    import sys

    other = sys.modules.get("accelerate.utils.other")
    if "deepspeed" in sys.modules or other is None or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    check = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = check


def set_deepspeed_engine_setup(strategy_cls: type, setup: Any) -> None:
    """Make ``setup(strategy, model, optimizer, lr_scheduler=None) -> (engine, optimizer)`` build the engine
    of ``strategy_cls`` (a subclass of Lightning's ``DeepSpeedStrategy``): it becomes the class's
    ``_setup_model_and_optimizer``, the one method through which Lightning's training and inference set-ups
    call ``deepspeed.initialize``. Lightning passes ``device_rank=root_device.index`` there, ``None`` for a
    CPU device, which DeepSpeed's engine compares with 0; no public hook sets it."""
    strategy_cls._setup_model_and_optimizer = setup


# ------------------------------------------------------------------------------------------------
# transformers


def loss_is_causal_lm(model: Any) -> bool:
    """Whether ``model.loss_function`` is ``ForCausalLMLoss``: ``transformers.loss.loss_utils.LOSS_MAPPING``
    (an internal table) maps ``model.loss_type``, falling back to ``ForCausalLMLoss`` for an unset or unknown
    type, as ``PreTrainedModel.loss_function`` does."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    return LOSS_MAPPING.get(model.loss_type, ForCausalLMLoss) is ForCausalLMLoss


def attention_backend(model: Any) -> str | None:
    """The attention implementation a transformers model runs (``config._attn_implementation``), for
    messages."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def no_split_modules(module: Any) -> list[str]:
    """The block classes a transformers model declares must not be split across devices
    (``_no_split_modules``; HF's FSDP wrap default); ``[]`` when it declares none."""
    return list(getattr(module, "_no_split_modules", None) or [])


# ------------------------------------------------------------------------------------------------ datasets


def dataset_fingerprint(ds: Any) -> str | None:
    """A ``datasets.Dataset``'s fingerprint (``_fingerprint``: the hash of its data and the transforms that
    made it); ``None`` for other datasets."""
    return getattr(ds, "_fingerprint", None)


def selection_indices(ds: Any) -> Any:
    """A ``datasets.Dataset``'s indices mapping (``_indices``, a pyarrow table whose first column maps rows to
    rows of the table it was selected from by ``select``/``train_test_split``/``shuffle``); ``None`` when
    unselected."""
    return getattr(ds, "_indices", None)


# ------------------------------------------------------------------------------------------------ torch


def unwrap_compiled(model: Any) -> Any:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``); ``model`` itself otherwise."""
    return getattr(model, "_orig_mod", model)


def unscales_gradients_itself(optimizer: Any) -> bool:
    """Whether the optimizer unscales AMP gradients inside its own ``step`` (``_step_supports_amp_scaling``,
    set by fused Adam/AdamW/SGD): the gradients are still scaled when a clip would read them."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def foreach_norm(tensors: list[Any], ord: float) -> list[Any]:
    """Per-tensor norms in one kernel per device and dtype (``torch._foreach_norm``, what ``clip_grad_norm_``
    calls; no public equivalent)."""
    import torch

    return list(torch._foreach_norm(tensors, ord))


def is_compiled_in_place(model: Any) -> bool:
    """Whether ``model.compile()`` (``nn.Module.compile``) compiled the module, or a module inside it (the
    base model a PEFT wrapper holds), in place: it sets ``_compiled_call_impl``, which ``__call__`` then
    runs; no public flag says so. A ``torch.compile(model)`` wrapper (``OptimizedModule``) counts too."""
    if hasattr(model, "_orig_mod"):
        return True
    modules = model.modules() if hasattr(model, "modules") else [model]
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in modules)


def compilations(since_us: int = 0) -> list[tuple[str, str | None, str | None]]:
    """``(compile id, recompile reason, failure)`` of each frame compilation ``torch.compile`` has recorded in
    this process that started at or after ``since_us`` (microseconds since the epoch, ``time.time_ns() //
    1000``), oldest first (``torch._dynamo.utils.get_compilation_metrics``, a bounded record; no public API
    lists compilations; its records of runtime events are left out). The id is dynamo's ``frame/compile``
    (``0/1``: frame 0's second compilation; ids start again after ``torch._dynamo.reset()``); the reason is
    the failed guard that caused a recompilation (``None`` for a frame's first); the failure, when the
    compilation failed and the frame ran eagerly. ``[]`` when the record is gone."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    return [
        (str(m.compile_id), m.recompile_reason, getattr(m, "fail_reason", None))
        for m in get_compilation_metrics()
        if not getattr(m, "is_runtime", False) and (getattr(m, "start_time_us", None) or 0) >= since_us
    ]


def mark_dimension_dynamic(tensor: Any, dim: int) -> None:
    """Compile dimension ``dim`` of ``tensor`` as a symbol from the first compilation on
    (``torch._dynamo.maybe_mark_dynamic``, the documented hint, only under ``torch._dynamo``; unlike
    ``mark_dynamic`` it lets a size of 0 or 1 specialise instead of failing). Without it the first compilation
    is static and the first other length recompiles."""
    import torch._dynamo

    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def checkpoint_blocks(blocks: list[Any]) -> None:
    """Recompute each of ``blocks``' activations in backward (non-reentrant), in place, with torch's
    composable ``checkpoint`` (``torch.distributed._composable.checkpoint``: forward hooks, made to be
    combined with ``fully_shard``; no public module path). Unlike ``checkpoint_wrapper`` it keeps the module
    tree and every parameter name, which the optimizer's groups, peft's adapter state dict and the export
    read."""
    from torch.distributed._composable import checkpoint

    for block in blocks:
        checkpoint(block)


def set_model_parallel_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """Set a Lightning ``ModelParallelStrategy``'s mesh sizes before its ``setup_environment`` builds the
    mesh (``_data_parallel_size``, ``_tensor_parallel_size``): the world size is known only then, and its
    ``"auto"`` means one data-parallel rank per node, not per process."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def dcp_entry_files(metadata: Any) -> dict[str, set[str]]:
    """The files (relative to the folder) holding each key of a ``torch.distributed.checkpoint`` index read by
    ``FileSystemReader.read_metadata()``: ``metadata.storage_data`` maps each stored chunk to
    ``FileSystemWriter``'s ``_StorageInfo`` (``relative_path``); no public API names an entry's file."""
    files: dict[str, set[str]] = {}
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    return files


def weights_only_default_globals() -> frozenset[str]:
    """The ``module.Name`` strings of every global ``torch.load(weights_only=True)`` accepts without
    ``safe_globals`` (tensors, storages, dtypes, ``OrderedDict``, ...): ``torch._weights_only_unpickler``'s
    ``_get_allowed_globals``; no public API lists them."""
    from torch import _weights_only_unpickler as unpickler

    return frozenset(unpickler._get_allowed_globals())
