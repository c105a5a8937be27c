"""FSDP2 as HF ``Trainer`` users configure FSDP: one ``fully_shard`` unit per decoder-layer block plus the
root.

``strategy=fsdp`` is Lightning's ``ModelParallelStrategy`` (PyTorch's FSDP2, ``torch.distributed.fsdp.
fully_shard``, over a one-dimensional data-parallel mesh of every rank; gloo on the CPU, NCCL on GPUs), with
the sharding done by the strategy itself (:class:`HFFSDPStrategy`), so ``HFLightningModule`` and a
LightningModule of one's own are sharded the same way.

HF's ``fsdp_transformer_layer_cls_to_wrap`` defaults to the model's ``_no_split_modules``
(``LlamaDecoderLayer``, ``T5Block``, ...): :class:`NoSplitModulesPolicy` reads the class names from the module
tree once the model exists. HF / accelerate options and what they become here:

- ``fsdp="full_shard"`` / ``"shard_grad_op"`` (accelerate's FSDP2 ``reshard_after_forward`` true / false):
  ``reshard_after_forward``;
- ``fsdp="offload"`` (accelerate's ``cpu_offload``): ``offload``, torch's ``CPUOffloadPolicy``;
- ``fsdp_config.activation_checkpointing``: ``activation_checkpointing``, torch's composable,
  non-reentrant ``checkpoint`` of each block (parameter names unchanged);
- ``bf16=True`` (``trainer.precision=bf16-mixed``): ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``, accelerate's FSDP2 default for bf16;
- ``fsdp_config.state_dict_type``: ``state_dict_type`` (``sharded``: a distributed checkpoint folder, one
  shard per rank; ``full``: one file gathered on rank 0).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from hf_lightning.checkpointing.sharded import AtomicShardedCheckpoints
from hf_lightning.compat import checkpoint_blocks, no_split_modules, set_model_parallel_sizes
from hf_lightning.core.errors import ConfigError
from hf_lightning.strategies.gradient_sync import fsdp_units, no_gradient_sync
from hf_lightning.strategies.launch import rendezvous_variables, restore_rendezvous

log = logging.getLogger(__name__)

STATE_DICT_TYPES = ("sharded", "full")
#: trainer.precision values that FSDP2 runs here, and what each becomes
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true")


OFFLOAD_ON_CPU = (
    "strategy.offload=true with trainer.accelerator=cpu: the parameters live on the CPU already, there is "
    "nothing to offload; allowed on cpu: strategy.offload=false"
)


class NoSplitModulesPolicy:
    """Which modules become FSDP units (and activation-checkpointed blocks): every module whose class name is
    in ``layer_classes``, or, when that is ``None``, in the HF model's ``_no_split_modules``.

    Raises:
        ConfigError: ``layer_classes`` is ``None`` and no module of the tree declares ``_no_split_modules``,
            or a named class does not occur in the model (the wrap would silently do nothing).
    """

    def __init__(self, layer_classes: Sequence[str] | None = None) -> None:
        self.layer_classes = tuple(layer_classes) if layer_classes else None
        self._names: frozenset[str] | None = None

    def resolve(self, root: nn.Module) -> frozenset[str]:
        """The class names to wrap, read from ``root``'s module tree (cached after the first call)."""
        if self._names is not None:
            return self._names
        present = {type(m).__name__ for m in root.modules()}
        if self.layer_classes is None:
            declared: list[str] = []
            for module in root.modules():
                declared.extend(no_split_modules(module))
            if not declared:
                raise ConfigError(
                    "strategy.layer_classes=null: the model declares no _no_split_modules; set "
                    "strategy.layer_classes to its transformer block class names (for example "
                    "[LlamaDecoderLayer])"
                )
            names = frozenset(n for n in declared if n in present)
        else:
            missing = [n for n in self.layer_classes if n not in present]
            if missing:
                raise ConfigError(
                    f"strategy.layer_classes: {missing} do not occur in the model; classes present include "
                    f"{sorted(n for n in present if 'Layer' in n or 'Block' in n)}"
                )
            names = frozenset(self.layer_classes)
        self._names = names
        return names

    def blocks(self, root: nn.Module) -> list[nn.Module]:
        """The modules of ``root`` to shard one by one, outermost first (a block inside a block is not
        one)."""
        names = self.resolve(root)
        found: list[nn.Module] = []
        inside: set[int] = set()
        for module in root.modules():
            if id(module) in inside:
                continue
            if type(module).__name__ in names:
                found.append(module)
                inside.update(id(m) for m in module.modules())
        return found


def mixed_precision_policy(precision: str) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``trainer.precision``: bf16 compute with float32 gradient
    reduction for ``bf16-mixed`` (accelerate's FSDP2 choice); ``None`` otherwise (the parameters' own dtype:
    float32, or bfloat16 under ``bf16-true``)."""
    if str(precision) != "bf16-mixed":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def outer_units(root: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The units above the blocks: ``root`` itself, or for a LightningModule without parameters of its own
    each child holding parameters outside the blocks (what its steps call: ``self.model``)."""
    import lightning as L

    if not isinstance(root, L.LightningModule) or any(True for _ in root.parameters(recurse=False)):
        return [root]
    inside = {id(p) for block in blocks for p in block.parameters()}
    return [c for c in root.children() if any(id(p) not in inside for p in c.parameters())]


def shard_module(
    root: nn.Module,
    mesh: Any,
    policy: NoSplitModulesPolicy,
    reshard_after_forward: bool = True,
    offload: bool = False,
    activation_checkpointing: bool = True,
    mp_policy: Any = None,
) -> tuple[list[str], list[str]]:
    """Apply FSDP2 to ``root`` in place: activation checkpointing around each block (optional), then
    ``fully_shard`` on each block, then on the rest (:func:`outer_units`): ``root``, or a LightningModule's
    children that hold parameters outside the blocks (its ``model``: embeddings, final norm, LM head). The
    outer units are the modules a step calls: FSDP2 gathers a unit's parameters in its forward, and a
    LightningModule's ``training_step`` may call ``self.model(...)`` rather than ``self(...)``.

    Args:
        root: the module to shard (a LightningModule holding the HF model).
        mesh: the one-dimensional data-parallel ``DeviceMesh``.
        policy: which modules are blocks.
        reshard_after_forward: free each block's gathered parameters after its forward (HF ``full_shard``)
            or keep them until its backward (``shard_grad_op``). The units above the blocks keep theirs until
            their backward either way (FSDP2's default for a root).
        offload: keep the parameter shards, their gradients and the optimizer step on the CPU
            (``CPUOffloadPolicy``; a GPU run only).
        activation_checkpointing: recompute each block's activations in backward (non-reentrant).
        mp_policy: a ``MixedPrecisionPolicy`` or ``None``.

    Returns:
        ``(block class names, outer unit names)`` for the log.

    Raises:
        ConfigError: see :class:`NoSplitModulesPolicy`.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    blocks = policy.blocks(root)
    names = sorted({type(b).__name__ for b in blocks})
    outer = outer_units(root, blocks)
    outer_names = [n for n, m in root.named_modules() if any(m is o for o in outer)]
    if activation_checkpointing:
        checkpoint_blocks(blocks)
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    # the outer units keep their gathered parameters from their forward to their backward (FSDP2's own choice
    # for a root when none is given): they would be gathered again at once, and the lean loss reads the LM
    # head's weight after the forward
    for unit in outer:
        fully_shard(unit, reshard_after_forward=False, **kwargs)
    return names, [n or type(root).__name__ for n in outer_names]


class HFFSDPStrategy(AtomicShardedCheckpoints, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as FSDP2 data parallelism over every rank (data-parallel size =
    world size, tensor-parallel size 1), sharding the LightningModule in :meth:`setup` with
    :func:`shard_module` (unless its ``configure_model`` already applied ``fully_shard``).

    Its checkpoints are :class:`~hf_lightning.checkpointing.sharded.AtomicShardedCheckpoints` folders (each
    rank writes its shard; atomic, checksummed, resharded on load).

    Lightning requires a ``configure_model`` hook of a module under this strategy (``HFLightningModule`` has
    one that builds nothing); a LightningModule of one's own needs one too, which may do nothing.

    Args:
        policy: which modules are blocks (:class:`NoSplitModulesPolicy`).
        reshard_after_forward, offload, activation_checkpointing: see :func:`shard_module`.
        precision: ``trainer.precision``; ``bf16-mixed`` adds the bf16 ``MixedPrecisionPolicy``.
        state_dict_type: ``sharded`` (a distributed checkpoint folder, each rank writing its shard) or
            ``full`` (one file gathered on rank 0).
        **kwargs: passed to ``ModelParallelStrategy`` (``process_group_backend``, ``timeout``).
    """

    def __init__(
        self,
        policy: NoSplitModulesPolicy | None = None,
        reshard_after_forward: bool = True,
        offload: bool = False,
        activation_checkpointing: bool = True,
        precision: str = "32-true",
        state_dict_type: str = "sharded",
        **kwargs: Any,
    ) -> None:
        super().__init__(save_distributed_checkpoint=state_dict_type == "sharded", **kwargs)
        self.policy = policy or NoSplitModulesPolicy()
        self.reshard_after_forward = reshard_after_forward
        self.offload = offload
        self.activation_checkpointing = activation_checkpointing
        self.precision = str(precision)
        self.state_dict_type = state_dict_type
        self._rendezvous = rendezvous_variables()  # put back by teardown after a one-process run

    def teardown(self) -> None:
        """Lightning's, then after a one-process run the rendezvous variables as they were when the strategy
        was made (:func:`~hf_lightning.strategies.launch.restore_rendezvous`)."""
        super().teardown()
        restore_rendezvous(self._rendezvous, self.world_size)

    def setup_environment(self) -> None:
        # one data-parallel dimension over all ranks: FSDP2 shards across every process, on every node
        set_model_parallel_sizes(self, self.num_nodes * self.num_processes, 1)
        super().setup_environment()

    def setup(self, trainer: Any) -> None:
        module = self.lightning_module
        if self.offload and self.root_device.type == "cpu":
            raise ConfigError(OFFLOAD_ON_CPU)
        if not fsdp_units(module):
            names, outer = shard_module(
                module,
                self.device_mesh["data_parallel"],
                self.policy,
                self.reshard_after_forward,
                self.offload,
                self.activation_checkpointing,
                mixed_precision_policy(self.precision),
            )
            if self.global_rank == 0:
                log.info(
                    "FSDP2: %d ranks, one fully_shard unit per %s block plus %s (the rest); "
                    "reshard_after_forward=%s, activation_checkpointing=%s, offload=%s, mixed precision: %s",
                    self.world_size,
                    "/".join(names),
                    ", ".join(outer),
                    self.reshard_after_forward,
                    self.activation_checkpointing,
                    self.offload,
                    "bf16 parameters, fp32 reduction" if self.precision == "bf16-mixed" else "none",
                )
        super().setup(trainer)
        self._units = fsdp_units(self.model)  # fixed from here on: read by every window's backwards

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Gradients of the backwards inside accumulate locally, unsharded, and are reduce-scattered at the
        next backward outside (FSDP2's ``set_requires_gradient_sync(False)``, its ``no_sync``)."""
        units = getattr(self, "_units", None)
        with no_gradient_sync(fsdp_units(self.model) if units is None else units):
            yield


def option_errors(state_dict_type: str, precision: Any) -> list[str]:
    """The refusals of :func:`fsdp_strategy`'s values (one line each; ``[]`` when they are fine)."""
    errors = []
    if state_dict_type not in STATE_DICT_TYPES:
        errors.append(
            f"strategy.state_dict_type={state_dict_type!r}; allowed values: {list(STATE_DICT_TYPES)}"
        )
    if str(precision) not in PRECISIONS:
        errors.append(
            f"trainer.precision={precision} with strategy=fsdp: float16 needs a gradient scaler for sharded "
            "gradients, which is not run here; allowed values: 32-true, bf16-mixed, bf16-true"
        )
    return errors


def fsdp_config_errors(strategy: Any, accelerator: Any) -> list[str]:
    """The config-time share of the refusals: ``strategy`` is the composed ``trainer.strategy`` node."""
    errors = option_errors(strategy.get("state_dict_type", "sharded"), strategy.get("precision", "32-true"))
    if strategy.get("offload") and accelerator == "cpu":
        errors.append(OFFLOAD_ON_CPU)
    return errors


def fsdp_strategy(
    layer_classes: Sequence[str] | None = None,
    reshard_after_forward: bool = True,
    offload: bool = False,
    activation_checkpointing: bool = True,
    state_dict_type: str = "sharded",
    precision: str = "32-true",
    process_group_backend: str | None = None,
) -> HFFSDPStrategy:
    """An :class:`HFFSDPStrategy` configured like HF's FSDP integration (``fsdp_version: 2``).

    Args:
        layer_classes: class names of the blocks (HF's ``transformer_layer_cls_to_wrap``); ``None``: the
            model's ``_no_split_modules``.
        reshard_after_forward: ``true`` = HF ``full_shard`` (ZeRO-3), ``false`` = ``shard_grad_op`` (ZeRO-2).
        offload: HF ``offload``: parameters, gradients and the optimizer step on the CPU (GPU runs).
        activation_checkpointing: recompute each block's activations in backward (non-reentrant).
        state_dict_type: ``sharded`` or ``full`` (HF ``fsdp_config.state_dict_type``).
        precision: ``trainer.precision`` (interpolated by the YAML).
        process_group_backend: ``None``: gloo on the CPU, NCCL on GPUs (Lightning's default for the device).

    Raises:
        ConfigError: an unknown ``state_dict_type``, or a precision FSDP2 does not run here.
    """
    errors = option_errors(state_dict_type, precision)
    if errors:
        raise ConfigError(errors[0])
    return HFFSDPStrategy(
        policy=NoSplitModulesPolicy(layer_classes),
        reshard_after_forward=reshard_after_forward,
        offload=offload,
        activation_checkpointing=activation_checkpointing,
        precision=precision,
        state_dict_type=state_dict_type,
        process_group_backend=process_group_backend,
    )
