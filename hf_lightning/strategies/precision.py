"""bf16 autocast that lets a fused optimizer clip gradients.

Lightning's ``MixedPrecision.clip_gradients`` refuses any optimizer that unscales gradients itself (fused
AdamW sets ``_step_supports_amp_scaling``), because under float16 the gradients it would clip are still
multiplied by the loss scale. bf16 autocast has no loss scale (no ``GradScaler``): the gradients are the true
ones, so clipping them is exact, and HF ``Trainer``'s default (fused AdamW, bf16, ``max_grad_norm=1``) works
here too.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.precision import MixedPrecision, Precision


class BF16MixedPrecision(MixedPrecision):
    """``MixedPrecision("bf16-mixed")`` whose clipping accepts fused optimizers (there is no scaler to
    undo)."""

    def __init__(self, device: str) -> None:
        super().__init__("bf16-mixed", device)

    def clip_gradients(
        self, optimizer: Any, clip_val: float = 0.0, gradient_clip_algorithm: Any = None
    ) -> None:
        if self.scaler is not None:  # never with bf16; kept so the float16 safety check stays if that changes
            return super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)
        kwargs = (
            {} if gradient_clip_algorithm is None else {"gradient_clip_algorithm": gradient_clip_algorithm}
        )
        return Precision.clip_gradients(self, optimizer, clip_val, **kwargs)


def precision_plugin(precision: Any, accelerator: str, strategy: Any) -> BF16MixedPrecision | None:
    """The plugin to use instead of ``trainer.precision``, or ``None`` to let Lightning choose.

    Only ``bf16-mixed`` with a strategy whose precision is Lightning's plain ``MixedPrecision`` (single
    device, DDP); FSDP and DeepSpeed bring their own precision plugins.
    """
    if str(precision) != "bf16-mixed":
        return None
    target = strategy.get("_target_", "") if isinstance(strategy, dict) else str(strategy)
    if "fsdp" in target.lower() or "deepspeed" in target.lower():
        return None
    return BF16MixedPrecision("cpu" if accelerator == "cpu" else "cuda")
