"""``python -m hf_lightning.train`` as a user runs it: the run folder contract, export, and bad input."""

from __future__ import annotations

import csv
import json
import os
import subprocess

import pytest
import torch

from tests.fork_server import run_module

pytestmark = pytest.mark.slow


def run_cli(*overrides: str, cwd=None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return run_module("hf_lightning.train", overrides, env=env, cwd=cwd or os.getcwd(), timeout=timeout)


def read_metrics(run_dir):
    with open(run_dir / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def test_sft_default_run_folder_contract(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "+experiment=sft",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=6",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2",
        "data.per_device_train_batch_size=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    assert (run_dir / ".hydra" / "config.yaml").is_file()
    rows = read_metrics(run_dir)
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert train_steps == [1, 2, 3, 4, 5, 6]  # a train/loss row for every logged optimizer step
    # linear warmup over 20 steps from optim.lr=1e-3 (experiment sft): step s ran at lr * (s - 1) / 20
    lrs = [float(r["lr"]) for r in rows if r.get("train/loss")]
    assert lrs == pytest.approx([1e-3 * (s - 1) / 20 for s in train_steps], rel=1e-6)
    val_steps = [int(r["step"]) for r in rows if r.get("val/loss")]
    assert val_steps == [3, 6]
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    ppl = [float(r["val/perplexity"]) for r in rows if r.get("val/loss")]
    assert ppl == pytest.approx([2.718281828459045**v for v in val], rel=1e-5)

    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 6 and "optimizer_states" in ckpt and "lr_schedulers" in ckpt

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf_model")
    tok = AutoTokenizer.from_pretrained(run_dir / "hf_model")
    assert tok.chat_template and tok.pad_token is not None and tok.eos_token == "<|endoftext|>"
    # a chat reply ends with <|im_end|>, a document with <|endoftext|>: generation stops on both
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    exported = model.state_dict()
    trained = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    for name, value in exported.items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_clm_on_a_jsonl_file(tmp_path):
    data = tmp_path / "tiny.jsonl"
    lines = [
        json.dumps({"text": f"Line {i}: the quick brown fox jumps over the lazy dog."}) for i in range(40)
    ]
    data.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    proc = run_cli(
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        "data.per_device_train_batch_size=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [int(r["step"]) for r in read_metrics(run_dir) if r.get("train/loss")] == [1, 2, 3]
    assert (run_dir / "hf_model" / "model.safetensors").is_file()


def _bad(tmp_path, *overrides):
    proc = run_cli("+experiment=sft", f"hydra.run.dir={tmp_path / 'run'}", "trainer.max_steps=1", *overrides)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def test_missing_data_path_names_the_path(tmp_path):
    err = _bad(tmp_path, f"data.path={tmp_path}/nope.jsonl")
    assert f"data.path={tmp_path}/nope.jsonl: no such file or folder" in err


def test_unreadable_data_file_names_the_file(tmp_path):
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}\nnot json at all\n')
    err = _bad(tmp_path, f"data.path={bad}")
    assert f"data.path={bad}: could not be read as json" in err


def test_file_without_expected_fields(tmp_path):
    bad = tmp_path / "fields.jsonl"
    bad.write_text('{"question": "a", "answer": "b"}\n{"question": "c", "answer": "d"}\n')
    err = _bad(tmp_path, f"data.path={bad}")
    # the format is told from the columns: none fits, so the line names them and a rename
    assert "cannot tell the data format from the columns ['question', 'answer']" in err
    assert "+data.rename_columns='{question: prompt, answer: completion}'" in err


def test_unknown_override_key(tmp_path):
    # with a leading + (Hydra adds the key) and without (Hydra would refuse it in its words, exit 1): one line
    for override in ("+data.no_such_key=1", "data.no_such_key=1"):
        err = _bad(tmp_path, override)
        assert "unknown config key data.no_such_key" in err and "per_device_train_batch_size" in err
        assert "Could not override" not in err and "HYDRA_FULL_ERROR" not in err
    proc = run_cli("+experiment=sft", f"hydra.run.dir={tmp_path / 'hf'}", "learning_rate=1e-4")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hf_lightning: error: learning_rate is HF's name: use optim.lr=0.0001"
    ]
    assert not (tmp_path / "hf").exists()  # refused before Hydra made the run folder
    # Hydra's multi-line composition errors (exit 1) a newcomer meets first: one line, exit 2
    for args in (["experiment=sft"], ["+experiment=sfy"], ["+experiment=sft", "+trainer.max_steps=5"]):
        proc = run_cli(*args, f"hydra.run.dir={tmp_path / 'hf'}")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("hf_lightning: error: "), (
            lines
        )
        assert "HYDRA_FULL_ERROR" not in proc.stderr


def test_model_path_that_is_not_a_model_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    err = _bad(tmp_path, f"model.name_or_path={tmp_path / 'empty'}")
    assert f"model.name_or_path={tmp_path / 'empty'}: no config.json" in err
    err = _bad(tmp_path, f"model.name_or_path={tmp_path / 'absent'}")
    assert "not a folder" in err


def test_resume_last_without_checkpoint_is_an_error(tmp_path):
    err = _bad(tmp_path, "ckpt_path=last")
    assert "ckpt_path=last: no checkpoint at" in err
