"""DeepSpeed ZeRO-2/3 with its batch, accumulation, clipping and precision fields derived from ours.

DeepSpeed reads those numbers from its own JSON; HF ``Trainer`` fills ``"auto"`` entries from
``TrainingArguments``. Here :func:`deepspeed_config` derives them from the Hydra config (the YAML passes them
by interpolation), so the two can never disagree, and a user JSON that sets one of them to a different value
is refused before anything is built.

Loss scaling: ``DeepSpeedEngine.backward`` divides the loss by ``gradient_accumulation_steps`` unless it is
called with ``scale_wrt_gas=False`` (HF ``Trainer`` passes ``False`` too). :class:`HFDeepSpeedStrategy` passes
``False``, so the gradient that reaches the optimizer is the one the module's loss defines, as under DDP.

Accumulation windows: each training batch is one window (``HFLightningModule`` steps it, Lightning's
``accumulate_grad_batches`` is 1), and the engine is told which backward closes it
(:meth:`HFDeepSpeedStrategy.block_backward_sync`), so ``engine.step()`` updates once per window, the short
last window of an epoch included. The engine itself is configured with one micro-batch per step
(``gradient_accumulation_steps`` 1 and ``train_batch_size`` = micro-batch x devices, the values Lightning's
strategy checks), while the accumulation is ours.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

from hf_lightning import compat
from hf_lightning.checkpointing.sharded import AtomicShardedCheckpoints
from hf_lightning.core.arguments import MISSING as _MISSING
from hf_lightning.core.arguments import PRECISIONS as _PRECISIONS
from hf_lightning.core.arguments import get_dotted as _get
from hf_lightning.core.arguments import set_dotted as _set
from hf_lightning.core.arguments import world_size
from hf_lightning.core.errors import ConfigError
from hf_lightning.strategies.launch import rendezvous_variables, restore_rendezvous

STAGES = (2, 3)
# the project's precisions (hf_lightning.core.arguments) that DeepSpeed runs: no float64
PRECISIONS = tuple(p for p in _PRECISIONS if not p.startswith("64"))
# sections of a user JSON that would take over what our own config owns
OWNED_SECTIONS = {"optimizer": "optim.*", "scheduler": "scheduler.*"}


def _precision_sections(precision: str) -> dict[str, dict[str, Any]]:
    precision = str(precision)
    if precision not in PRECISIONS:
        raise ConfigError(
            f"trainer.precision={precision!r} with DeepSpeed; allowed values: {list(PRECISIONS)}"
        )
    return {
        "bf16": {"enabled": precision.startswith("bf16")},
        "fp16": {"enabled": precision.startswith("16")},
    }


def deepspeed_config(
    stage: int,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    max_grad_norm: float | None,
    precision: str,
    devices: Any = 1,
    num_nodes: int = 1,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    user_config: str | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config dict derived from ours, merged with an optional user JSON.

    Derived fields (HF ``Trainer``'s ``"auto"`` fields): ``train_micro_batch_size_per_gpu`` =
    ``data.per_device_train_batch_size``; ``gradient_accumulation_steps`` =
    ``data.gradient_accumulation_steps``; ``train_batch_size`` = micro-batch x accumulation x devices x nodes
    (omitted when the device count is ``auto``); ``gradient_clipping`` = ``module.max_grad_norm`` (``0``
    = off); ``bf16.enabled`` / ``fp16.enabled`` from ``trainer.precision``; ``zero_optimization.stage``.
    ZeRO-3 also sets ``stage3_gather_16bit_weights_on_model_save`` so that the HF export can consolidate the
    weights.

    A user JSON (path or mapping) may add any other field. A derived field it sets must equal ours or be
    ``"auto"``; ``optimizer`` / ``scheduler`` sections are refused (``optim.*`` / ``scheduler.*`` own them).

    Returns:
        A new dict (the user's mapping is not modified).

    Raises:
        ConfigError: a bad stage, micro-batch, accumulation, precision, an unreadable JSON, or a conflicting
            field (the message names both values and the key of ours that owns it).
    """
    if stage not in STAGES:
        raise ConfigError(f"strategy.stage={stage!r}; allowed values: {list(STAGES)}")
    for key, value in (
        ("data.per_device_train_batch_size", micro_batch_size),
        ("data.gradient_accumulation_steps", gradient_accumulation_steps),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}={value!r}; allowed values: an integer >= 1")
    clip = 0.0 if max_grad_norm is None else float(max_grad_norm)
    if clip < 0:
        raise ConfigError(f"module.max_grad_norm={max_grad_norm!r}; allowed values: null or a number >= 0")
    try:
        world = world_size(devices, num_nodes)
    except ValueError:
        raise ConfigError(
            f"trainer.devices={devices!r}; allowed values: an integer >= 1, -1, 'auto', or a list of device "
            "indices"
        ) from None

    zero: dict[str, Any] = {"stage": stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_parameters:
        if stage != 3:
            raise ConfigError(
                "strategy.offload_parameters=true needs ZeRO stage 3 (strategy=deepspeed_zero3)"
            )
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    derived: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "gradient_clipping": clip,
        **_precision_sections(precision),
        "zero_optimization": zero,
        # we build the torch optimizer ourselves (HF parameter groups); DeepSpeed wraps it
        "zero_allow_untested_optimizer": True,
    }
    if world is not None:
        derived["train_batch_size"] = micro_batch_size * gradient_accumulation_steps * world
    owners = {
        "train_micro_batch_size_per_gpu": "data.per_device_train_batch_size",
        "gradient_accumulation_steps": "data.gradient_accumulation_steps",
        "train_batch_size": "data.per_device_train_batch_size x data.gradient_accumulation_steps x devices",
        "gradient_clipping": "module.max_grad_norm",
        "bf16.enabled": "trainer.precision",
        "fp16.enabled": "trainer.precision",
        "zero_optimization.stage": "strategy (deepspeed_zero2 / deepspeed_zero3)",
    }
    if user_config is None:
        return derived
    user = _read_user_config(user_config)
    where = user_config if isinstance(user_config, str) else "strategy.config"
    for section, owner in OWNED_SECTIONS.items():
        if section in user:
            raise ConfigError(
                f"{where}: the DeepSpeed JSON has an {section!r} section, but {owner} owns it here; remove "
                f"the section and set {owner} instead"
            )
    merged = copy.deepcopy(user)
    for dotted, owner in owners.items():
        ours = _get(derived, dotted)
        if ours is _MISSING:
            # train_batch_size with devices=auto: a user value is checked by DeepSpeed itself at start-up
            continue
        theirs = _get(user, dotted)
        if theirs is not _MISSING and theirs != "auto" and theirs != ours:
            raise ConfigError(
                f"{where}: {dotted}={theirs!r} conflicts with {owner} (which gives {ours!r}); set it through "
                f'{owner}, or to "auto" or leave it out of the JSON'
            )
        _set(merged, dotted, ours)
    # fields that only we derive and that the user did not mention (offload, 16-bit gather, ...)
    for key, value in derived.items():
        if key not in merged:
            merged[key] = value
    for key, value in derived["zero_optimization"].items():
        merged["zero_optimization"].setdefault(key, value)
    return merged


def _read_user_config(user_config: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(user_config, Mapping):
        return dict(user_config)
    if not os.path.isfile(user_config):
        raise ConfigError(f"strategy.config={user_config}: no such file (expected a DeepSpeed JSON)")
    try:
        with open(user_config) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as err:
        raise ConfigError(f"strategy.config={user_config}: not readable as JSON ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"strategy.config={user_config}: a DeepSpeed config must be a JSON object")
    return data


class HFDeepSpeedStrategy(AtomicShardedCheckpoints, DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` whose engine steps once per accumulation window, as the module says.

    ``HFLightningModule.training_step`` runs the window's backwards and one ``optimizer.step()`` (DeepSpeed's
    precision plugin: ``engine.step()``); the backwards before the window's last run inside
    :meth:`block_backward_sync`, which tells the engine they do not close its window
    (``set_gradient_accumulation_boundary(False)``, the call accelerate's ``DeepSpeedEngineWrapper.backward``
    makes for HF ``Trainer``); the last one closes it. ``scale_wrt_gas=False`` keeps the module's loss as it
    is (see the module docstring).

    Checkpoints: the engine's own folder (``DeepSpeedEngine.save_checkpoint``, tag ``checkpoint``, as
    Lightning's strategy writes it), made atomic and checksummed by
    :class:`~hf_lightning.checkpointing.sharded.AtomicShardedCheckpoints`: every rank writes its part into a
    temporary sibling folder, rank 0 adds the manifest and renames it into place; a load checks the manifest
    first; a removed checkpoint is removed whole.

    Args and keyword args: Lightning's ``DeepSpeedStrategy``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rendezvous = rendezvous_variables()  # put back by teardown after a one-process run

    def _distributed_save(self) -> bool:
        return True  # the engine writes a folder, each rank its part

    def _write_parts(self, checkpoint: dict[str, Any], folder: str) -> dict[str, Any]:
        """Lightning's ``DeepSpeedStrategy.save_checkpoint`` into ``folder``: the engine writes the model
        and optimizer states (each rank its partition) with the rest of ``checkpoint`` as its client state."""
        DeepSpeedStrategy.save_checkpoint(self, checkpoint, folder)
        return {}

    def _write_rest(self, rest: dict[str, Any], folder: str) -> None:
        """Nothing: the engine wrote Lightning's part with its model states."""

    def _load_folder(self, path: str, weights_only: bool | None) -> dict[str, Any]:
        """Lightning's ``DeepSpeedStrategy.load_checkpoint``: the engine loads its folder (model, and when
        fitting the optimizer partitions) and returns Lightning's part. The engine unpickles its files with
        the weights-only restriction off, so each is scanned first
        (:func:`~hf_lightning.checkpointing.sharded.check_deepspeed_states`).

        Raises:
            UnsafeCheckpointError: a states file names a pickled type outside the allow-list.
        """
        from hf_lightning.checkpointing.sharded import check_deepspeed_states

        check_deepspeed_states(path)
        return DeepSpeedStrategy.load_checkpoint(self, path, weights_only)

    def teardown(self) -> None:
        """Lightning's, then ``torch.nn.functional.linear`` as it was at :meth:`setup_environment`: a ZeRO-3
        engine replaces it with DeepSpeed's own (from ``deepspeed.zero.Init`` on) and leaves it there, so
        that a later model in the same process (a ``torch.compile`` among them) would run through it; after
        a one-process run also the rendezvous variables as they were when the strategy was made
        (:func:`~hf_lightning.strategies.launch.restore_rendezvous`)."""
        super().teardown()
        linear = getattr(self, "_linear", None)
        if linear is not None:
            import torch.nn.functional

            torch.nn.functional.linear = linear
        restore_rendezvous(self._rendezvous, self.world_size)

    def setup_environment(self) -> None:
        """Lightning's, and on the CPU accelerator the same steps without its CUDA-only check.

        Lightning's ``DeepSpeedStrategy.setup_environment`` refuses any accelerator but CUDA, then runs
        ``DDPStrategy.setup_environment`` (device set-up, ``deepspeed.init_distributed``). DeepSpeed has a
        CPU accelerator of its own (``deepspeed.accelerator.get_accelerator()`` is ``cpu`` where no GPU is
        found, or with ``DS_ACCELERATOR=cpu``) whose process group is gloo; with it the ZeRO-2/3 engines run
        on CPU ranks.

        Raises:
            ConfigError: ``trainer.accelerator=cpu`` while DeepSpeed picked another accelerator (set
                ``DS_ACCELERATOR=cpu`` before the run).
        """
        import torch.nn.functional

        self._linear = torch.nn.functional.linear  # restored at teardown: ZeRO-3 replaces it
        if not isinstance(self.accelerator, CPUAccelerator):
            super().setup_environment()
            return
        from deepspeed.accelerator import get_accelerator

        found = get_accelerator().device_name()
        if found != "cpu":
            raise ConfigError(
                f"trainer.accelerator=cpu with DeepSpeed, but DeepSpeed picked the {found!r} accelerator; "
                "set DS_ACCELERATOR=cpu in the environment to run it on CPU, or trainer.accelerator=gpu"
            )
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        """Lightning's, and on the CPU accelerator the same steps without its check that device indices
        equal local ranks (CPU devices have no index): the world ranks, the variables
        ``deepspeed.init_distributed`` reads (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, as Lightning sets them), then its gloo process group."""
        if not isinstance(self.accelerator, CPUAccelerator):
            super().setup_distributed()
            return
        import deepspeed

        reset_seed()
        self.set_world_ranks()
        env = self.cluster_environment
        os.environ.update(
            MASTER_ADDR=env.main_address,
            MASTER_PORT=str(env.main_port),
            RANK=str(self.global_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
        )
        deepspeed.init_distributed("gloo", distributed_port=env.main_port)

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """The backward of a micro-batch that does not close its window: the engine is told so, and after it
        the ZeRO optimizer starts the next micro-batch as ``DeepSpeedEngine.forward`` starts one
        (``clear_backward_seen_flag``: ZeRO-3 counts the micro-batch, so that the next backward adds to the
        gradient partitions instead of overwriting them). The engine's forward runs once per window here (the
        window's micro-batches go through the module inside ``training_step``), so without this a ZeRO-3
        window kept only its last micro-batch's gradient."""
        self.model.set_gradient_accumulation_boundary(False)
        try:
            yield
        finally:
            self.model.set_gradient_accumulation_boundary(True)
            # only ZeRO optimizers have it (older DeepSpeed releases counted the micro-batch in the backward)
            next_micro_batch = getattr(self.model.optimizer, "clear_backward_seen_flag", None)
            if next_micro_batch is not None:
                next_micro_batch()

    def backward(self, closure_loss: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("scale_wrt_gas", False)
        return super().backward(closure_loss, optimizer, *args, **kwargs)


def _setup_engine(
    strategy: HFDeepSpeedStrategy, model: Any, optimizer: Any, lr_scheduler: Any = None
) -> tuple[Any, Any]:
    """``deepspeed.initialize`` as Lightning calls it, with the device rank of a CPU rank set to its local
    rank (Lightning passes the device index, which CPU devices lack)."""
    import deepspeed

    if isinstance(strategy.accelerator, CPUAccelerator):
        device_rank = strategy.local_rank
    else:
        device_rank = strategy.root_device.index
    engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
        args=argparse.Namespace(device_rank=device_rank),
        config=strategy.config,
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        dist_init_required=False,
    )
    return engine, deepspeed_optimizer


compat.set_deepspeed_engine_setup(HFDeepSpeedStrategy, _setup_engine)


def deepspeed_strategy(
    stage: int,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    max_grad_norm: float | None,
    precision: str,
    devices: Any = 1,
    num_nodes: int = 1,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    config: str | Mapping[str, Any] | None = None,
) -> HFDeepSpeedStrategy:
    """:class:`HFDeepSpeedStrategy` with the config of :func:`deepspeed_config` (same arguments; ``config`` is
    the optional user JSON).

    Raises:
        ConfigError: see :func:`deepspeed_config`; or the ``deepspeed`` package is not installed.
    """
    derived = deepspeed_config(
        stage,
        micro_batch_size,
        gradient_accumulation_steps,
        max_grad_norm,
        precision,
        devices,
        num_nodes,
        offload_optimizer,
        offload_parameters,
        config,
    )
    from hf_lightning.config.optional import is_missing, missing_message

    if is_missing("deepspeed"):
        raise ConfigError(missing_message(f"strategy=deepspeed_zero{stage}", "deepspeed"))
    # the engine sees one micro-batch per step (the window is ours, see the module docstring): Lightning sets
    # its gradient_accumulation_steps from the Trainer's accumulate_grad_batches (1) and refuses one given
    derived.pop("gradient_accumulation_steps", None)
    if "train_batch_size" in derived:
        derived["train_batch_size"] //= gradient_accumulation_steps
    return HFDeepSpeedStrategy(config=derived)
