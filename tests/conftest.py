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


@pytest.fixture(scope="session")
def word_tokenizer():
    """Word-level tokenizer with hand-checkable ids (``a`` = 4 ... ``z`` = 29); see ``data_support.py``."""
    from tests.data_support import make_word_tokenizer

    return make_word_tokenizer()


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    """GPT-2 BPE from the shared data folder (pad = eos = ``<|endoftext|>``); skips when the folder is missing."""
    from transformers import PreTrainedTokenizerFast

    from tests.data_support import shared_data

    path = shared_data() / "gpt2-tokenizer" / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|endoftext|>")
