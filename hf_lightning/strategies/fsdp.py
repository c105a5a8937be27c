"""FSDP as HF ``Trainer`` users configure it: full shard, wrap and checkpoint on the decoder-layer class.

HF's ``fsdp_transformer_layer_cls_to_wrap`` defaults to the model's ``_no_split_modules``
(``LlamaDecoderLayer``, ``T5Block``, ...). The model does not exist when the Trainer (and its strategy) is
built, so the wrap policy is resolved lazily: :class:`NoSplitModulesPolicy` reads the class names from the
module tree the first time FSDP asks it about the root.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from hf_lightning.compat import no_split_modules
from hf_lightning.core.errors import ConfigError

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
STATE_DICT_TYPES = ("full", "sharded")


class NoSplitModulesPolicy:
    """An FSDP auto-wrap policy (the ``_Policy``-free callable form) that wraps every module whose class name
    is in ``layer_classes``, or, when that is ``None``, in the HF model's ``_no_split_modules``.

    Called by ``torch.distributed.fsdp.wrap._recursive_wrap`` as ``policy(module, recurse,
    nonwrapped_numel)``: with ``recurse=True`` it answers "descend into this module" (always), with
    ``recurse=False`` "wrap this one".

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

    def __call__(self, module: nn.Module, recurse: bool, nonwrapped_numel: int = 0, **_: Any) -> bool:
        if recurse:
            if self._names is None:
                self.resolve(module)  # the first call is on the root: the whole tree is visible
            return True
        return type(module).__name__ in (self._names or ())


def fsdp_strategy(
    sharding_strategy: str = "FULL_SHARD",
    layer_classes: Sequence[str] | None = None,
    activation_checkpointing: bool = True,
    state_dict_type: str = "full",
    cpu_offload: bool = False,
    use_orig_params: bool = True,
    limit_all_gathers: bool = True,
):
    """A ``lightning.pytorch.strategies.FSDPStrategy`` configured like HF's FSDP integration.

    Args:
        sharding_strategy: one of ``FULL_SHARD`` (ZeRO-3 like), ``SHARD_GRAD_OP``, ``NO_SHARD``,
        ``HYBRID_SHARD``. layer_classes: class names to wrap as FSDP units (and to checkpoint); ``None``: the
            model's ``_no_split_modules``.
        activation_checkpointing: recompute each wrapped layer's activations in backward (non-reentrant).
        state_dict_type: ``full`` gathers the whole state dict on rank 0 for checkpoints and the HF export;
            ``sharded`` writes one shard per rank (the HF export still gathers a full one).
        cpu_offload: keep parameters and gradients on the CPU between uses.
        use_orig_params: keep the original parameters visible to the optimizer, so that HF's weight-decay
            groups (by parameter name) work; required by our optimizer builder.
        limit_all_gathers: rate-limit all-gathers to bound memory (torch's recommended setting).

    Raises:
        ConfigError: an unknown ``sharding_strategy`` or ``state_dict_type``, or ``use_orig_params=false``.
    """
    from lightning.pytorch.strategies import FSDPStrategy

    if sharding_strategy not in SHARDING_STRATEGIES:
        raise ConfigError(
            f"strategy.sharding_strategy={sharding_strategy!r}; allowed values: {list(SHARDING_STRATEGIES)}"
        )
    if state_dict_type not in STATE_DICT_TYPES:
        raise ConfigError(
            f"strategy.state_dict_type={state_dict_type!r}; allowed values: {list(STATE_DICT_TYPES)}"
        )
    if not use_orig_params:
        raise ConfigError(
            "strategy.use_orig_params=false: the optimizer's weight-decay groups are built by parameter "
            "name, which flattened FSDP parameters lose; allowed values: true"
        )
    policy = NoSplitModulesPolicy(layer_classes)
    return FSDPStrategy(
        sharding_strategy=sharding_strategy,
        auto_wrap_policy=policy,
        activation_checkpointing_policy=policy if activation_checkpointing else None,
        state_dict_type=state_dict_type,
        cpu_offload=cpu_offload,
        use_orig_params=use_orig_params,
        limit_all_gathers=limit_all_gathers,
    )
