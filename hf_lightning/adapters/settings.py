"""The ``peft`` config node and its application to a built model (``peft.get_peft_model``).

``conf/peft/lora.yaml`` and ``conf/peft/qlora.yaml`` fill :class:`AdapterSettings`; its field names are
``peft.LoraConfig``'s (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``, ...) and, for QLoRA,
``transformers.BitsAndBytesConfig``'s (``load_in_4bit``, ``bnb_4bit_quant_type``, ...), so a TRL or PEFT
user's values carry over unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)

# model.task -> peft's TaskType (the head peft wraps, and the modules it saves with the adapter)
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "seq2seq_lm": "SEQ_2_SEQ_LM", "sequence_classification": "SEQ_CLS"}


@dataclass(frozen=True)
class AdapterSettings:
    """The ``peft`` config node (``peft=lora`` / ``peft=qlora``).

    Args:
        r: LoRA rank (``LoraConfig.r``).
        lora_alpha: LoRA scaling numerator: the update is ``lora_alpha / r`` (``/ sqrt(r)`` with
            ``use_rslora``) times ``B @ A``.
        lora_dropout: dropout on the adapter's input.
        target_modules: module names (or one regex) to adapt; ``all-linear``: every linear layer but the
            output head (peft's shorthand).
        modules_to_save: modules trained in full and saved with the adapter (a new classification head).
        use_rslora: rank-stabilised scaling ``lora_alpha / sqrt(r)``.
        use_dora: weight-decomposed LoRA (DoRA).
        bias: ``none``, ``all`` or ``lora_only``: which biases train.
        init_lora_weights: peft's initialisation (``true``: A Kaiming-uniform, B zeros, so training starts
            from the base model exactly).
        init_seed: the seed of the adapter's random initialisation (``${seed}``): the adapter starts the same
            whatever consumed random numbers before it.
        load_in_4bit: QLoRA: the base model is loaded in 4 bits with ``bitsandbytes`` (CUDA only).
        bnb_4bit_quant_type / bnb_4bit_compute_dtype / bnb_4bit_use_double_quant: ``BitsAndBytesConfig``'s.
    """

    r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.0
    target_modules: Any = "all-linear"
    modules_to_save: Any = None
    use_rslora: bool = False
    use_dora: bool = False
    bias: str = "none"
    init_lora_weights: Any = True
    init_seed: int = 0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "nf4"
    bnb_4bit_compute_dtype: str = "bfloat16"
    bnb_4bit_use_double_quant: bool = True
    extra: dict = field(default_factory=dict)

    def lora_config(self, task: str = "causal_lm") -> Any:
        """The ``peft.LoraConfig`` of these settings for a model of ``model.task``.

        Raises:
            ConfigError: a value peft refuses (names the key).
        """
        from peft import LoraConfig

        if self.r < 1:
            raise ConfigError(f"peft.r={self.r}: allowed values: an integer >= 1")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"peft.lora_dropout={self.lora_dropout}: allowed values: a number in [0, 1)")
        if self.bias not in ("none", "all", "lora_only"):
            raise ConfigError(f"peft.bias={self.bias!r}: allowed values: none, all, lora_only")
        targets = self.target_modules
        targets = list(targets) if isinstance(targets, (list, tuple)) else targets
        saved = list(self.modules_to_save) if self.modules_to_save else None
        return LoraConfig(
            task_type=TASK_TYPES.get(task, "CAUSAL_LM"),
            r=self.r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=targets,
            modules_to_save=saved,
            use_rslora=self.use_rslora,
            use_dora=self.use_dora,
            bias=self.bias,
            init_lora_weights=self.init_lora_weights,
            **self.extra,
        )


def adapter_settings(node: dict[str, Any] | None) -> AdapterSettings | None:
    """:class:`AdapterSettings` of a resolved ``peft`` config node; ``None`` for ``peft=null``.

    Raises:
        ConfigError: a key :class:`AdapterSettings` does not have (lists the allowed keys).
    """
    if not node:
        return None
    known = set(AdapterSettings.__dataclass_fields__) - {"extra"}
    unknown = sorted(set(node) - known)
    if unknown:
        raise ConfigError(f"peft.{unknown[0]}: unknown key; allowed keys: {', '.join(sorted(known))}")
    return AdapterSettings(**node)


def apply_adapters(
    model: torch.nn.Module,
    settings: AdapterSettings,
    task: str = "causal_lm",
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    """``peft.get_peft_model(model, settings.lora_config(task))``: the base frozen, the adapter trainable.

    The adapter's random init runs under ``torch.manual_seed(settings.init_seed)`` in a forked RNG (the global
    RNG stream is left as it was). With gradient checkpointing the embeddings' output is made to require grad
    (``enable_input_require_grads``, as HF ``Trainer`` / TRL do): with a frozen base nothing before the first
    checkpointed layer would otherwise. A 4-bit model goes through ``peft.prepare_model_for_kbit_training``
    without its checkpointing switch: the model comes with checkpointing on already (``build_model``,
    non-reentrant), and peft's switch calls ``gradient_checkpointing_enable``, which transformers 5 deprecates
    for ``activation_checkpointing_enable``.

    Returns:
        The ``peft.PeftModel``; its ``print_trainable_parameters`` counts are logged.
    """
    from peft import get_peft_model

    config = settings.lora_config(task)
    if settings.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    elif gradient_checkpointing:
        model.enable_input_require_grads()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(settings.init_seed)
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as err:  # e.g. target_modules naming no module of this model
            text = " ".join(str(err).split())[:300]
            raise ConfigError(f"peft.target_modules={settings.target_modules}: {text}") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info(
        "peft: LoRA r=%d alpha=%s on %s: %d trainable of %d parameters (%.2f%%)%s",
        settings.r,
        settings.lora_alpha,
        settings.target_modules,
        trainable,
        total,
        100 * trainable / max(total, 1),
        ", base in 4 bits" if settings.load_in_4bit else "",
    )
    return peft_model


def describe(settings: AdapterSettings) -> dict[str, Any]:
    """The settings as a plain dict (for the log and the checkpoint)."""
    return {k: v for k, v in asdict(settings).items() if k != "extra"}
