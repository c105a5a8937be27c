"""Shared fixtures: offline hub, a private cache, Hydra state and process groups cleaned between tests."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """The embedded default's data and tokenizer are built once per session into a private folder."""
    if "HF_LIGHTNING_CACHE" not in os.environ:
        os.environ["HF_LIGHTNING_CACHE"] = str(tmp_path_factory.mktemp("hf_lightning_cache"))
    yield


@pytest.fixture(autouse=True)
def _clean_global_state():
    yield
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def default_tokenizer():
    """The embedded default tokenizer (byte-level BPE trained on chatterbot-corpus, ChatML template)."""
    from transformers import AutoTokenizer

    from hf_lightning.defaults import prepare_chatterbot, train_default_tokenizer

    return AutoTokenizer.from_pretrained(train_default_tokenizer(prepare_chatterbot()["train"]))


# ------------------------------------------------------------------------------------- Hydra composition
# What every composed test config is shrunk to (lightning-hydra-template's cfg_train fixture): CPU, one device,
# a couple of steps, tiny validation, no progress bar. Tests add their own overrides after these.
SHRINK = (
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "trainer.max_steps=2",
    "trainer.max_epochs=1",
    "trainer.limit_val_batches=2",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=4",
    "data.per_device_eval_batch_size=4",
)


@pytest.fixture
def compose_cfg(tmp_path):
    """``compose_cfg(*overrides, shrink=True, hydra=False)``: the config of ``python -m hf_lightning.train
    OVERRIDES``, shrunk by :data:`SHRINK`, whose run folder is this test's ``tmp_path``."""
    from hf_lightning.config.compose import compose_train

    def make(*overrides, shrink=True, hydra=False):
        return compose_train([*(SHRINK if shrink else ()), *overrides], output_dir=tmp_path, return_hydra_config=hydra)

    return make


@pytest.fixture(scope="session")
def shared_data():
    """``shared/data`` beside the repository (``$HF_LIGHTNING_SHARED_DATA`` wins); skips when absent."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("HF_LIGHTNING_SHARED_DATA", os.path.join(repo, "..", "shared", "data"))
    if not os.path.isdir(path):
        pytest.skip(f"shared data folder {path} not found (set HF_LIGHTNING_SHARED_DATA)")
    return os.path.abspath(path)
