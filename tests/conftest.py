"""Shared fixtures: offline hub, a private cache, Hydra state and process groups cleaned between tests."""

from __future__ import annotations

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# A spawned gloo process sometimes aborts in torch's teardown as it exits, after its work is done ("terminate
# called without an active exception", the parent sees SIGABRT after fit has ended on both ranks): seen in CI,
# not reproduced in a dozen runs of the same test alone. Distributed tests get one more try for that failure
# only: any other failure, or the abort twice, fails them.
EXIT_ABORT = ["terminated with signal SIGABRT"]


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=EXIT_ABORT))


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """The embedded default's data and tokenizer are built once per session into a private folder."""
    if "HF_LIGHTNING_CACHE" not in os.environ:
        os.environ["HF_LIGHTNING_CACHE"] = str(tmp_path_factory.mktemp("hf_lightning_cache"))
    yield


# what a distributed strategy's set-up writes into the environment for its process group (Lightning's
# strategies leave them behind): a later test in the same process, or a process it starts, would read a world
# from them. After each test they are put back as they were when the session started, not as the test found
# them, since a module-scoped fixture runs before a test's own snapshot would be taken.
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_SESSION_RENDEZVOUS = {key: os.environ.get(key) for key in _RENDEZVOUS}


@pytest.fixture(autouse=True)
def _clean_global_state():
    before = _SESSION_RENDEZVOUS
    import torch.nn.functional

    linear = torch.nn.functional.linear
    yield
    # a DeepSpeed ZeRO-3 engine replaces torch.nn.functional.linear with its own and leaves it there, which a
    # later test's torch.compile cannot trace
    torch.nn.functional.linear = linear
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        deepspeed_comm = sys.modules.get("deepspeed.comm")
        if deepspeed_comm is not None:
            # DeepSpeed's own, which also drops the groups it caches (a later engine would reuse them)
            deepspeed_comm.destroy_process_group()
        else:
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
    """GPT-2 BPE from the shared data folder (pad = eos = ``<|endoftext|>``); skips when the folder is
    missing."""
    from transformers import PreTrainedTokenizerFast

    from tests.data_support import shared_data

    path = shared_data() / "gpt2-tokenizer" / "tokenizer.json"
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


# ------------------------------------------------------------------------------------- Hydra composition
# What every composed test config is shrunk to (lightning-hydra-template's cfg_train fixture): CPU, one
# device, a couple of steps, tiny validation, no progress bar. Tests add their own overrides after these.
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
        return compose_train(
            [*(SHRINK if shrink else ()), *overrides], output_dir=tmp_path, return_hydra_config=hydra
        )

    return make


@pytest.fixture(scope="session")
def shared_data():
    """``shared/data`` as a string path (see ``tests/data_support.shared_data``); skips when absent."""
    from tests.data_support import shared_data as find

    return str(find().resolve())
