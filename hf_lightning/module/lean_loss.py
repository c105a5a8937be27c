"""The lean loss of a causal or encoder-decoder LM: its final (decoder) hidden states and LM head, without its
``(tokens x vocab)`` logits.

:class:`LeanLoss` decides once whether a model qualifies, then, per micro-batch, runs the model's own
``forward`` with a forward pre-hook on its LM head (``get_output_embeddings()``): the hook keeps the head's
input, the final hidden states ``(B, L, H)``, and hands the head only the last position, so the model computes
``(B, 1, V)`` logits instead of ``(B, L, V)``. The loss then comes from
:func:`~hf_lightning.module.linear_cross_entropy.linear_cross_entropy` on the head's weight, chunk by chunk.
Running the real ``forward`` (rather than calling the decoder directly) keeps whatever the model does before
its head (a scaled hidden state, PEFT wrappers, ``use_cache=False``) and works for any model class.

What a forward does *after* its head is known by model family, from the config (``transformers`` 5.x modeling
files): ``final_logit_softcapping`` (Gemma 2/3/4, VaultGemma, nanochat, ...), Cohere's ``logit_scale``
(multiplied), Granite's ``logits_scaling`` (divided), HyperCLOVA X's ``logits_scaling`` (multiplied), Muse's
``output_multiplier``. A config key that looks like another logit transform makes the model fall back, and on
its first micro-batch the model's own last-position logits are compared with the lean path's: a model whose
forward changes its logits otherwise (a bias added, tokens masked, the vocabulary sliced) falls back too.

Where it pays (``module.lean_loss=null``, the default): the lean path runs more small operations per
micro-batch than one fused ``cross_entropy`` over the logits (a fixed cost), and saves work that grows with
the vocabulary: the ``(tokens x vocab)`` logits, their softmax and gradient, and the head's products for
positions without a target. Below an LM-head vocabulary of :data:`LEAN_MIN_VOCAB` the fixed cost wins and the
full-logits loss is the faster exact path; from it on the lean loss is (measured with
``scripts/bench_loop.py --lean-sweep``: docs/benchmarks.md). ``true`` / ``false`` force one path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.module.linear_cross_entropy import (
    LogitTransform,
    default_chunk_size,
    linear_cross_entropy,
    linear_cross_entropy_predictions,
    linear_cross_entropy_stats,
)

log = logging.getLogger(__name__)

# config keys that may change the logits after the head; the ones a family below reads are handled, keys of
# attention / router / MLP internals are not about the logits
_SUSPECT_KEY = re.compile(r"soft_?cap|logit_cap|logits?_?scal|(logit|lm_head|output)\w*multiplier")
_INTERNAL_KEY = re.compile(r"^(attn|attention|conf_attention|moe_router|router|mlp|gate|up)_")
# the first micro-batch's check: largest |lean - model| over the last position's logits, relative to the
# largest
# |logit|. dtype noise (a bf16 softcap against ours in float32) stays far below it; a missing factor, bias or
# mask is far above it
_CHECK_TOLERANCE = 2e-2

#: the smallest LM-head vocabulary for which ``module.lean_loss=null`` (auto) takes the lean loss: below it
#: the full logits are faster (docs/benchmarks.md, "Where the lean loss pays")
LEAN_MIN_VOCAB = 256


def pays(vocab_size: int) -> bool:
    """Whether the lean loss is the faster exact path for an LM head of ``vocab_size`` outputs: at least
    :data:`LEAN_MIN_VOCAB`."""
    return vocab_size >= LEAN_MIN_VOCAB


def logit_transform(config: Any) -> tuple[LogitTransform | None, str | None]:
    """``(transform, None)`` for a config whose post-head transform is known, else ``(None, why not)``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(text, "model_type", "") or "")
    multiplier = divisor = None
    used = {"final_logit_softcapping"}
    if model_type.startswith("cohere"):
        multiplier, used = getattr(text, "logit_scale", None), used | {"logit_scale"}
    elif model_type.startswith("granite"):
        divisor, used = getattr(text, "logits_scaling", None), used | {"logits_scaling"}
    elif model_type == "hyperclovax":
        multiplier, used = getattr(text, "logits_scaling", None), used | {"logits_scaling"}
    elif model_type.startswith("muse_"):
        multiplier, used = getattr(text, "output_multiplier", None), used | {"output_multiplier"}
    for source in (text, config) if text is not config else (text,):
        for key, value in source.to_dict().items():
            if key in used or value in (None, False) or isinstance(value, dict) or _INTERNAL_KEY.match(key):
                continue
            if _SUSPECT_KEY.search(key):
                return None, f"its config sets {key}={value!r}, which may transform the logits"
    softcap = getattr(text, "final_logit_softcapping", None)
    return LogitTransform(
        multiplier=None if multiplier is None else float(multiplier),
        divisor=None if divisor is None else float(divisor),
        softcap=float(softcap) if softcap else None,
    ), None


def output_head(model: nn.Module) -> tuple[nn.Linear | None, str | None]:
    """The model's LM head if it is a plain ``torch.nn.Linear`` with floating weights, else ``(None, why
    not)``."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        return None, "it has no LM head reachable by get_output_embeddings()"
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        return None, f"its LM head is a {type(head).__name__}, not a plain torch.nn.Linear"
    if not head.weight.is_floating_point():
        return None, f"its LM head's weight is {head.weight.dtype} (quantized)"
    return head, None


class LeanLoss:
    """The lean loss for one model, or the reason it falls back.

    Args:
        model: the model ``HFLightningModule`` trains.
        reason: a reason decided by the caller (``None``: look at the model).
        auto: ``module.lean_loss=null``: also off when the head's vocabulary is too small for the lean loss to
            pay (:func:`pays`); ``False``: on whenever the model allows it.

    Attributes:
        reason: why the lean loss is not used (``None`` while it is).
        chunk_size: tokens per chunk (``None``:
        :func:`~hf_lightning.module.linear_cross_entropy.default_chunk_size`).
    """

    def __init__(self, model: nn.Module, reason: str | None = None, auto: bool = False) -> None:
        self.head: nn.Linear | None = None
        self.transform: LogitTransform | None = None
        self.reason = reason
        self.auto = auto
        self.chunk_size: int | None = None
        self._checked = False
        self._said: str | None = None
        if reason is None:
            self.head, self.reason = output_head(model)
        if self.reason is None and auto and not pays(self.head.weight.shape[0]):
            self.reason = (
                f"module.lean_loss=null chose them for an LM head of {self.head.weight.shape[0]} outputs, "
                f"below {LEAN_MIN_VOCAB}, where they are faster (module.lean_loss=true forces the lean loss)"
            )
        if self.reason is None:
            self.transform, self.reason = logit_transform(getattr(model, "config", None) or _NoConfig())

    @property
    def active(self) -> bool:
        return self.reason is None

    def chunk_rows(self) -> int:
        """Tokens per chunk of the LM head's products (while :attr:`active`)."""
        return self.chunk_size or default_chunk_size(self.head.weight.shape[0], self.head.weight.device)

    def describe(self) -> str:
        """One line for the log: what the lean loss does, or why it is off."""
        if not self.active:
            return f"the loss is computed from the full logits: {self.reason}"
        vocab, hidden = self.head.weight.shape
        chunk = self.chunk_rows()
        chosen = (
            f"module.lean_loss=null chose it: {vocab} outputs, at least {LEAN_MIN_VOCAB}; "
            if self.auto
            else ""
        )
        return (
            f"lean loss: on (the {vocab} x {hidden} LM head applied to at most {chunk} tokens at a time, "
            f"never to all tokens at once; logit transform: {self.transform.describe()}; "
            f"{chosen}module.lean_loss=false turns it off)"
        )

    def say(self, rank_zero: bool = True) -> None:
        """Log :meth:`describe` at INFO if it changed since the last call (on rank zero only)."""
        line = self.describe()
        if line != self._said:
            self._said = line
            if rank_zero:
                log.info(line)

    def turn_off(self, reason: str) -> None:
        self.reason = reason

    @contextmanager
    def _captured(self):  # noqa: ANN202
        inputs: list[Any] = []

        def keep_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor] | None:
            if len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() < 2:
                inputs.append(None)
                return None
            inputs.append(args[0])
            return (args[0][..., -1:, :],)

        handle = self.head.register_forward_pre_hook(keep_input)
        try:
            yield inputs
        finally:
            handle.remove()

    def forward(self, call: Callable[[], Any], label_shape: torch.Size) -> tuple[Any, torch.Tensor] | None:
        """Run ``call()`` (the model's forward) keeping the head's input: ``(outputs, hidden (B, L, H))``.

        ``outputs.logits`` is set to ``None`` (the model computed only the last position's). On the first call
        the lean path is checked against those logits; ``None`` (and :attr:`reason` set) when the model does
        not fit, in which case the caller runs the plain path.
        """
        with self._captured() as inputs:
            if self._checked:
                outputs = call()
            else:
                try:
                    outputs = call()
                except Exception as err:  # noqa: BLE001 (the plain path runs next and raises a real error again)
                    self._checked = True
                    self.turn_off(f"its forward failed with one position given to its LM head ({err!r:.200})")
                    return None
        if len(inputs) != 1 or inputs[0] is None:
            self.turn_off(
                f"its forward called the LM head {len(inputs)} times, or not with one hidden-state tensor"
            )
            return None
        hidden = inputs[0]
        if is_sharded(self.head.weight):
            self.turn_off(
                "the LM head's weight is still sharded after the model's forward (FSDP2 gathers it for the "
                "forward of the unit that holds it only)"
            )
            return None
        if hidden.shape[:-1] != label_shape:
            self.turn_off(
                f"the LM head's input has shape {tuple(hidden.shape)}, not that of the labels + hidden size"
            )
            return None
        logits = _logits(outputs)
        if not self._checked:
            self._checked = True
            problem = self._mismatch(hidden, logits)
            if problem is not None:
                self.turn_off(problem)
                return None
        if isinstance(outputs, dict):  # ModelOutput is an OrderedDict
            outputs["logits"] = None
        return outputs, hidden

    @torch.no_grad()
    def _mismatch(self, hidden: torch.Tensor, logits: torch.Tensor | None) -> str | None:
        """Why the model's last-position logits differ from the lean path's (one host read), or ``None``."""
        if logits is None:
            return "its forward returned no logits to check the lean path against"
        head = self.head
        mine = self.transform(F.linear(hidden[..., -1:, :], head.weight, head.bias).float())
        if logits.shape != mine.shape:
            return (
                f"its logits have shape {tuple(logits.shape)} where lm_head(hidden) has {tuple(mine.shape)}"
            )
        ref = logits.float()
        err, scale = float((mine - ref).abs().max()), float(ref.abs().max())
        if not err <= _CHECK_TOLERANCE * scale + 1e-6:
            return (
                f"its logits differ from lm_head(hidden) with logit transform {self.transform.describe()} by "
                f"up to {err:.3g} (largest logit {scale:.3g}): its forward changes them in a way the lean "
                "loss does not reproduce"
            )
        return None

    def _compact(self, hidden: torch.Tensor, targets: torch.Tensor, count: int | None):  # noqa: ANN202
        """``(N, H)`` hidden states and ``(N,)`` targets; with ``count`` (the targets, known on the host) only
        the target positions, in order, chosen without a host-device sync."""
        flat_h, flat_t = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1).to(hidden.device)
        if count is not None and count < flat_t.numel():
            # a stable sort puts the target positions first, in their order
            index = torch.argsort((flat_t == IGNORE_INDEX).to(torch.int8), stable=True)[:count]
            flat_h, flat_t = flat_h.index_select(0, index), flat_t.index_select(0, index)
        return flat_h, flat_t

    def loss_sum(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        label_smoothing: float = 0.0,
        count: int | None = None,
    ) -> torch.Tensor:
        """Summed token CE (0-dim float32) of ``hidden`` ``(B, L, H)`` against shifted ``targets`` ``(B, L)``.

        ``count``: the number of targets (``!= -100``) when known on the host; it must be exact (a smaller
        count drops targets): only the target rows are then multiplied by the head.
        """
        flat_h, flat_t = self._compact(hidden, targets, count)
        return linear_cross_entropy(
            flat_h,
            self.head.weight,
            flat_t,
            self.head.bias,
            self.transform,
            label_smoothing,
            self.chunk_size,
        )

    def stats(
        self, hidden: torch.Tensor, targets: torch.Tensor, count: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Evaluation: ``(loss sum, correct argmax count)`` without gradients (see :meth:`loss_sum`)."""
        flat_h, flat_t = self._compact(hidden, targets, count)
        return linear_cross_entropy_stats(
            flat_h, self.head.weight, flat_t, self.head.bias, self.transform, self.chunk_size
        )

    def predictions(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        labels: torch.Tensor,
        preprocess: Callable[[torch.Tensor, torch.Tensor], Any],
        targets_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Evaluation with HF's ``preprocess_logits_for_metrics`` on chunks of positions: ``(loss sum,
        correct, predictions (B, L, ...))`` from ``hidden`` ``(B, L, H)``, shifted ``targets`` and the batch's
        ``labels`` (both ``(B, L)``); with ``targets_only`` only at the positions with a target (``-100``
        elsewhere); see
        :func:`~hf_lightning.module.linear_cross_entropy.linear_cross_entropy_predictions` (which raises
        ``NotPositionWise``)."""
        flat_h = hidden.reshape(-1, hidden.size(-1))
        loss_sum, correct, preds = linear_cross_entropy_predictions(
            flat_h,
            self.head.weight,
            targets.reshape(-1),
            labels.reshape(-1),
            preprocess,
            self.head.bias,
            self.transform,
            self.chunk_size,
            targets_only,
        )
        return loss_sum, correct, preds.reshape(*labels.shape, *preds.shape[2:])

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits ``(B, L, V)`` from ``hidden`` ``(B, L, H)``: its head, then its logit
        transform (in the head's dtype)."""
        return self.transform(F.linear(hidden, self.head.weight, self.head.bias))


class _NoConfig:
    def to_dict(self) -> dict[str, Any]:
        return {}


def is_sharded(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is a ``DTensor`` (a shard of a parameter that FSDP2 or tensor parallelism split),
    not the whole tensor the lean loss multiplies by."""
    from torch.distributed.tensor import DTensor

    return isinstance(weight, DTensor)


def _logits(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, dict):
        return outputs.get("logits")
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, tuple) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    return logits


def arguments_reason(lean_loss: bool | None, loss_source: str, token_targets: bool) -> str | None:
    """Why ``HFLightningModule``'s arguments rule the lean loss out (``None``: it is up to the model; with
    ``lean_loss=None`` also to the size of its head).

    ``loss_source`` is :attr:`HFLightningModule.loss_source`; ``token_targets`` whether the labels are the LM
    head's token targets (a causal LM's shifted by one, an encoder-decoder's decoder labels).
    """
    if lean_loss is False:
        return "module.lean_loss=false"
    if loss_source in ("compute_loss_func", "model"):
        what = "module.compute_loss_func" if loss_source == "compute_loss_func" else "the model's own loss"
        return f"{what} computes the loss from the model's logits"
    if not token_targets:
        return "the model is neither a causal LM nor an encoder-decoder LM (its labels are not token targets)"
    return None


def strategy_reason(strategy: Any) -> str | None:
    """Why the lean loss cannot run under a Lightning ``strategy`` (``None``: it can).

    The lean loss reads the head's weight after the model's forward: strategies that keep every parameter
    whole on every rank qualify (single device, DDP), and FSDP2 (``ModelParallelStrategy``,
    ``strategy=fsdp``), whose root unit keeps its gathered parameters (the LM head among them) from its
    forward until its backward; :meth:`LeanLoss.forward` checks that the weight it reads is whole and falls
    back otherwise. FSDP1 and DeepSpeed may shard it (DeepSpeed ZeRO-1/2 would keep it whole, but is not
    tested here).
    """
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    whole = isinstance(strategy, (SingleDeviceStrategy, ModelParallelStrategy)) or (
        isinstance(strategy, DDPStrategy) and not isinstance(strategy, DeepSpeedStrategy)
    )
    return None if whole else f"the strategy {type(strategy).__name__} may shard the LM head's weight"
