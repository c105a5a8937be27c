"""The README's plain PyTorch loop, run as written: a new order every epoch, and a saved position that makes a
restarted loop read exactly the batches the loop that never stopped reads."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from tests.data_support import make_word_tokenizer, tiny_llama, write_chats
from tests.docs_support import after_setup, docs_block

REPO = Path(__file__).resolve().parents[2]
ROWS = 11  # batches of 4: 3 per epoch, the last one of 3 rows
EPOCHS = 3  # the block's range(..., 3)


def readme_block(name: str) -> str:
    """The block of docs/python.md, without its own tokenizer, model and chat file (the test brings them)."""
    return after_setup(docs_block(name))


class Stopped(Exception):
    """The process 'dies' at the forward of this step."""


def run_block(folder: Path, monkeypatch, record: list, stop_at: int | None = None, seed: int = 0):
    """The README block in ``folder`` with a fresh model (init ``seed``); each forward's batch is appended to
    ``record``; ``stop_at``: raise at that step's forward (the steps before it are saved). Returns the
    model."""
    monkeypatch.chdir(folder)
    model = tiny_llama(seed=seed).train()

    def hook(module, args, kwargs):
        if stop_at is not None and len(record) >= stop_at:
            raise Stopped
        record.append({k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    model.register_forward_pre_hook(hook, with_kwargs=True)
    namespace = {"tokenizer": make_word_tokenizer(), "model": model, "__name__": "__main__"}
    with contextlib.suppress(Stopped):
        exec(compile(readme_block("plain-loop"), "<README.md plain-loop>", "exec"), namespace)
    return model


def rows_of(batch: dict) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]


def test_the_readme_loop_stopped_and_run_again_reads_the_same_batches(tmp_path, monkeypatch):
    tok = make_word_tokenizer()
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    rows = write_chats(straight_dir, ROWS)
    straight: list[dict] = []
    reference = run_block(straight_dir, monkeypatch, straight)

    # every epoch holds each row once (the ids of HF's apply_chat_template), in a new order
    per_epoch = 3
    assert len(straight) == EPOCHS * per_epoch
    expected = sorted(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False) for r in rows)
    batches = [straight[e * per_epoch : (e + 1) * per_epoch] for e in range(EPOCHS)]
    epochs = [[r for b in epoch_batches for r in rows_of(b)] for epoch_batches in batches]
    for epoch in epochs:
        assert sorted(epoch) == expected
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]

    for stop in (2, 3, 7):  # inside the first epoch, at its end, inside the third
        folder = tmp_path / f"stop{stop}"
        folder.mkdir()
        write_chats(folder, ROWS)
        seen: list[dict] = []
        run_block(folder, monkeypatch, seen, stop_at=stop)
        assert len(seen) == stop
        resumed = run_block(folder, monkeypatch, seen, seed=1)  # another init: the saved weights replace it
        assert len(seen) == len(straight), stop
        for got, want in zip(seen, straight):
            assert got.keys() == want.keys() == {"input_ids", "attention_mask", "labels"}
            for key in want:
                assert torch.equal(got[key], want[key]), (stop, key)
        for (name, got), want in zip(resumed.state_dict().items(), reference.state_dict().values()):
            assert torch.equal(got, want), (stop, name)


def test_the_saved_position_names_the_epoch_and_the_batches_read(tmp_path, monkeypatch):
    write_chats(tmp_path, ROWS)
    run_block(tmp_path, monkeypatch, [], stop_at=5)
    state = torch.load(tmp_path / "loop.pt")["data"]
    # 5 batches read: 3 of epoch 0, 2 of epoch 1
    assert {k: state[k] for k in ("epoch", "batches_consumed")} == {"epoch": 1, "batches_consumed": 2}
    assert state["signature"]["per_device_train_batch_size"] == 4


@pytest.mark.parametrize("stop", [1, 3, 4])
def test_a_stream_resumes_at_the_same_batch(tmp_path, stop):
    """A stream has no index to jump to: the restarted loader reads and drops the batches trained on."""
    import datasets

    from hf_lightning import HFDataModule

    write_chats(tmp_path, ROWS)

    def loop(state=None, stop_at=None):
        source = datasets.load_dataset("json", data_files=str(tmp_path / "chats.jsonl"), split="train")
        dm = HFDataModule(
            make_word_tokenizer(),
            path=source.to_iterable_dataset(num_shards=2),
            per_device_train_batch_size=4,
            validation_split=0.0,
            model_input_names=["input_ids", "attention_mask"],
        )
        if state is not None:
            dm.load_state_dict(state)
        loader, seen, saved = dm.train_dataloader(), [], None
        for _ in range(dm.state_dict()["epoch"], 2):
            for batch in loader:
                if len(seen) == stop_at:
                    return seen, saved  # the state saved after the last step
                seen.append(batch["input_ids"])
                saved = dm.state_dict()
        return seen, saved

    straight, _ = loop()
    first, state = loop(stop_at=stop)
    rest, _ = loop(state=state)
    assert len(first + rest) == len(straight)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, straight))
    assert [t.tolist() for t in straight[:3]] != [t.tolist() for t in straight[3:]]  # epoch 1 is reshuffled


def test_the_readme_loop_trains_a_loaded_model_with_dropout_on(tmp_path, monkeypatch):
    # from_pretrained returns the model in eval mode; before, the block trained it so, with dropout off
    from transformers import AutoModelForCausalLM

    tiny_llama(attention_dropout=0.1).save_pretrained(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert not model.training and model.config.attention_dropout == 0.1
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    write_chats(tmp_path, ROWS)
    monkeypatch.chdir(tmp_path)
    namespace = {"tokenizer": make_word_tokenizer(), "model": model, "__name__": "__main__"}
    exec(compile(readme_block("plain-loop"), "<README.md plain-loop>", "exec"), namespace)
    assert modes == [True] * EPOCHS * 3  # every step of the 3 epochs of 3 batches
    assert all(m.training for m in model.modules())
