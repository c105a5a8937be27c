"""Adapter fine-tuning with the ``peft`` library: LoRA (``peft=lora``) and QLoRA (``peft=qlora``).

- :mod:`~hf_lightning.adapters.settings`: the ``peft`` config node (its keys are :class:`AdapterSettings`'
  fields), the ``LoraConfig`` it makes, and its application to a built model (:func:`apply_adapters`).
- :mod:`~hf_lightning.adapters.quantization`: QLoRA's 4-bit loading (``bitsandbytes``, CUDA only).
- :mod:`~hf_lightning.adapters.checkpoint`: a checkpoint holds the trainable weights only; the frozen base is
  filled back from the model on load.

``peft=null`` (the default) is full fine-tuning and none of this runs.
"""

from hf_lightning.adapters.checkpoint import is_adapter_model
from hf_lightning.adapters.settings import AdapterSettings, apply_adapters

__all__ = ["AdapterSettings", "apply_adapters", "is_adapter_model"]
