"""One test per function of ``hf_lightning/compat.py`` that reads transformers, datasets, torch or DeepSpeed
internals (models, datasets, compiled modules, optimizers, norms), on the installed versions.
"""

from __future__ import annotations

import time

import pytest
import torch

from hf_lightning import compat
from tests.data_support import tiny_llama


@pytest.mark.slow  # a DeepSpeed engine's start-up
def test_zero3_full_state_dict(monkeypatch):
    """A one-process ZeRO-3 engine on DeepSpeed's CPU accelerator: every parameter is a partition (size 0
    outside a gather), and the consolidated state dict holds the model's full weights."""
    deepspeed = pytest.importorskip("deepspeed")
    for key, value in {
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29531",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    deepspeed.init_distributed("gloo")
    model = tiny_llama()
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
        },
    )
    assert all(p.numel() == 0 for p in engine.module.parameters())
    gathered = compat.zero3_full_state_dict(engine)
    assert gathered.keys() == full.keys()
    for name, tensor in full.items():
        assert torch.equal(gathered[name], tensor), name


def test_loss_is_causal_lm():
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    bert = BertForSequenceClassification(
        BertConfig(
            vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
    )
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2))
    assert compat.loss_is_causal_lm(tiny_llama()) and compat.loss_is_causal_lm(gpt2)
    assert not compat.loss_is_causal_lm(bert)


def test_attention_backend():
    assert compat.attention_backend(tiny_llama(attn_implementation="eager")) == "eager"
    assert compat.attention_backend(tiny_llama(attn_implementation="sdpa")) == "sdpa"
    assert compat.attention_backend(torch.nn.Linear(1, 1)) is None


def test_no_split_modules():
    assert compat.no_split_modules(tiny_llama()) == ["LlamaDecoderLayer"]
    assert compat.no_split_modules(torch.nn.Linear(1, 1)) == []


def _double(row):
    return {"x": row["x"] * 2}


def test_dataset_fingerprint():
    """Same data and transform: same fingerprint (the cache key datasets uses); another transform: another."""
    from datasets import Dataset

    ds = Dataset.from_dict({"x": [1, 2, 3]})
    doubled = ds.map(_double)
    assert isinstance(compat.dataset_fingerprint(ds), str)
    assert compat.dataset_fingerprint(doubled) == compat.dataset_fingerprint(ds.map(_double))
    assert compat.dataset_fingerprint(doubled) != compat.dataset_fingerprint(ds)
    assert compat.dataset_fingerprint([1, 2]) is None


def test_selection_indices():
    from datasets import Dataset

    ds = Dataset.from_dict({"x": list(range(10))})
    assert compat.selection_indices(ds) is None
    picked = ds.select([7, 3, 5])
    assert compat.selection_indices(picked).column(0).to_pylist() == [7, 3, 5] == picked["x"]


def test_unwrap_compiled():
    model = torch.nn.Linear(2, 2)
    assert compat.unwrap_compiled(torch.compile(model)) is model
    assert compat.unwrap_compiled(model) is model


def test_unscales_gradients_itself():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert compat.unscales_gradients_itself(torch.optim.AdamW(params, fused=True))
    assert not compat.unscales_gradients_itself(torch.optim.AdamW(params))
    assert not compat.unscales_gradients_itself(torch.optim.SGD(params, lr=0.1))


def test_foreach_norm():
    tensors = [torch.tensor([1.0, -3.0]), torch.tensor([[0.5, float("nan")]]), torch.tensor([2.0])]
    for ord in (2.0, float("inf")):
        got = compat.foreach_norm(tensors, ord)
        expected = [torch.linalg.vector_norm(t, ord) for t in tensors]
        torch.testing.assert_close(torch.stack(got), torch.stack(expected), equal_nan=True)


def test_is_compiled_in_place():
    model = torch.nn.Linear(2, 2)
    assert not compat.is_compiled_in_place(model)
    assert compat.is_compiled_in_place(torch.compile(torch.nn.Linear(2, 2)))
    model.compile()
    assert compat.is_compiled_in_place(model)
    assert compat.is_compiled_in_place(torch.nn.Sequential(model))  # inside a wrapper (PEFT's)


def _rows_sum(x):
    return (x * 2).sum(dim=1)


def test_compilations_and_mark_dimension_dynamic():
    """A second length recompiles, and the record says why; marked symbolic, it does not."""
    torch._dynamo.reset()
    since = time.time_ns() // 1000
    fn = torch.compile(_rows_sum, backend="eager")
    fn(torch.ones(2, 3))
    fn(torch.ones(2, 5))
    new = compat.compilations(since)
    assert [c[1] is None for c in new] == [True, False]
    assert "size mismatch at index 1" in new[1][1] and new[0][2] is None

    torch._dynamo.reset()
    since = time.time_ns() // 1000
    fn = torch.compile(_rows_sum, backend="eager")
    for length in (3, 5, 7):
        x = torch.ones(2, length)
        compat.mark_dimension_dynamic(x, 1)
        fn(x)
    assert [c[0] for c in compat.compilations(since)] == ["0/0"]


def test_checkpoint_blocks():
    class Block(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Block.calls += 1
            return super().forward(x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    names = [n for n, _ in model.named_parameters()]
    x = torch.randn(3, 4)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compat.checkpoint_blocks([model[0]])
    assert [n for n, _ in model.named_parameters()] == names  # no wrapper, no renamed parameter
    Block.calls = 0
    model(x).sum().backward()
    assert Block.calls == 2  # the block's forward ran again in backward
    for got, ref in zip((p.grad for p in model.parameters()), plain, strict=True):
        torch.testing.assert_close(got, ref)


def test_dcp_entry_files_names_the_file_each_key_is_stored_in(tmp_path):
    """A one-process DCP save writes one shard file; every key of its index lives there."""
    import os
    import warnings

    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, save

    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # DCP: "assuming the intent is to save in a single process"
        save({"w": torch.ones(2), "step": 3}, storage_writer=FileSystemWriter(str(tmp_path)))
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".distcp"))
    assert shards == ["__0_0.distcp"]
    files = compat.dcp_entry_files(FileSystemReader(str(tmp_path)).read_metadata())
    assert files == {"w": set(shards), "step": set(shards)}


@pytest.mark.slow  # a fresh interpreter, so that no other test has imported DeepSpeed
def test_unwrap_without_deepspeed(tmp_path):
    """``save_pretrained`` in the block writes the same folder without importing DeepSpeed; outside it,
    accelerate's unwrap imports DeepSpeed (the cost the block exists to skip), so the check can fail."""
    pytest.importorskip("deepspeed")
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hf_lightning.compat import unwrap_without_deepspeed\n"
        "from tests.data_support import tiny_llama\n"
        "model = tiny_llama()\n"
        f"with unwrap_without_deepspeed():\n    model.save_pretrained({str(tmp_path / 'a')!r})\n"
        "print('inside', 'deepspeed' in sys.modules)\n"
        f"model.save_pretrained({str(tmp_path / 'b')!r})\n"
        "print('outside', 'deepspeed' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "inside False" in out and "outside True" in out
    a, b = ((tmp_path / d / "model.safetensors").read_bytes() for d in "ab")
    assert a == b


def test_weights_only_default_globals_are_what_torch_load_takes_without_safe_globals(tmp_path):
    """What the list holds loads under ``weights_only=True``; a global outside it (a ``pathlib`` path) does
    not."""
    import pathlib
    import pickle

    names = compat.weights_only_default_globals()
    assert "collections.OrderedDict" in names and "torch._utils._rebuild_tensor_v2" in names
    assert "pathlib.PurePosixPath" not in names and "pathlib.PosixPath" not in names
    path = tmp_path / "p.pt"
    torch.save({"w": torch.ones(1)}, path)
    assert torch.load(path, weights_only=True)["w"].item() == 1.0
    torch.save({"p": pathlib.PurePosixPath("a")}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
