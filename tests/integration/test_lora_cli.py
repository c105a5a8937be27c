"""``peft=lora`` through the CLI: adapter-only checkpoints, exact resume, both exports, DDP.

A 2-layer version of the default Llama, ``+experiment=clm`` on a small text file, LoRA on every linear layer
with dropout on (so the resume must restore the RNG as well as the adapter and its optimizer state).
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.errors.support import run_train_cli

pytestmark = pytest.mark.slow

SMALL = [
    "model.config.hidden_size=64",
    "model.config.intermediate_size=128",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=2",
    "model.config.num_key_value_heads=2",
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = random.Random(1)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "tired",
        "cats",
        "watch",
    ]
    path = tmp_path_factory.mktemp("data") / "lines.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(3, 30)))}) + "\n" for _ in range(40)
        )
    )
    return path


def cli(run_dir, data, *overrides):
    return run_train_cli(
        "+experiment=clm",
        "peft=lora",
        "peft.r=4",
        "peft.lora_alpha=8",
        "peft.lora_dropout=0.1",
        "optim.lr=1e-2",
        f"data.path={data}",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=8",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=0",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        "data.per_device_train_batch_size=2",
        "data.max_length=32",
        "data.validation_split=0",
        *SMALL,
        *overrides,
    )


def losses(run_dir):
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): r["train/loss"] for r in csv.DictReader(fh) if r.get("train/loss")}


@pytest.fixture(scope="module")
def straight(text_file, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora") / "run"
    proc = cli(run, text_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def test_the_checkpoint_holds_the_adapter_and_its_optimizer_state_only(straight):
    adapter = load_file(straight / "hf_model" / "adapter_model.safetensors")
    ckpt = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)
    state = ckpt["state_dict"]
    # peft's adapter file names the same tensors without the module prefix and the adapter name
    assert sorted(k.removeprefix("model.").replace(".default", "") for k in state) == sorted(adapter)
    for key, value in state.items():
        assert torch.equal(value, adapter[key.removeprefix("model.").replace(".default", "")]), key
    (opt,) = ckpt["optimizer_states"]
    moments = [t for s in opt["state"].values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    # AdamW keeps two moments per trainable tensor and nothing else: 3x the adapter's bytes in all
    assert len(moments) == 2 * len(adapter)
    stored = sum(t.numel() * t.element_size() for t in [*state.values(), *moments])
    assert stored == 3 * adapter_bytes
    base = load_file(straight / "hf_model" / "base_model" / "model.safetensors")  # the random-init base
    assert sum(t.numel() * t.element_size() for t in base.values()) > 20 * adapter_bytes


def test_the_adapter_export_loads_with_auto_peft_and_generates(straight):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    folder = straight / "hf_model"
    model = AutoPeftModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    adapter = load_file(folder / "adapter_model.safetensors")
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert loaded.keys() == adapter.keys()
    assert all(torch.equal(loaded[k], adapter[k]) for k in adapter)
    # the base is the run's own, not re-initialised: its weights are the ones the checkpoint left out
    ckpt = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["hf_lightning_adapter"]["frozen_entries_left_out"] > 0
    base = load_file(folder / "base_model" / "model.safetensors")
    ours = model.get_base_model().state_dict()
    for key, value in base.items():
        wrapped = key.rsplit(".", 1)
        name = key if key in ours else f"{wrapped[0]}.base_layer.{wrapped[1]}"
        assert torch.equal(ours[name], value), key
    ids = tokenizer("the quick brown", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 5


def test_merged_export_equals_base_plus_adapter(straight, text_file, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    merged_run = tmp_path / "merged"
    proc = cli(merged_run, text_file, "export.merge_adapters=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = merged_run / "hf_model"
    assert not (folder / "adapter_config.json").exists()
    assert (folder / "tokenizer.json").is_file() and (folder / "chat_template.jinja").is_file()
    merged = AutoModelForCausalLM.from_pretrained(folder)
    assert not any("lora_" in k for k in merged.state_dict())
    unmerged = AutoPeftModelForCausalLM.from_pretrained(straight / "hf_model")  # the same training, unmerged
    ids = torch.tensor([[5, 17, 29, 41, 53, 2]])
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, unmerged(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


def test_killed_and_resumed_lora_run_equals_straight(straight, text_file, tmp_path):
    resumed = tmp_path / "resumed"
    kill = ("+callbacks.kill._target_=tests.resume_support.SignalAtStep", "+callbacks.kill.step=5")
    stopped = cli(resumed, text_file, *kill)
    assert stopped.returncode == -9, stopped.stderr[-3000:]
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    proc = cli(resumed, text_file, "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(straight / "hf_model" / "adapter_model.safetensors")
    b = load_file(resumed / "hf_model" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bit-identical
    assert losses(resumed) == losses(straight)


def test_a_lora_checkpoint_is_refused_without_peft(straight, text_file, tmp_path):
    from tests.errors.support import one_line_error

    run = tmp_path / "nopeft"
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={text_file}",
        f"hydra.run.dir={run}",
        f"ckpt_path={straight / 'checkpoints' / 'step000004.ckpt'}",
        "trainer.max_steps=8",
        "data.validation_split=0",
        *SMALL,
    )
    line = one_line_error(proc)
    assert "its weights do not fit the model" in line


@pytest.mark.distributed
def test_two_gloo_ranks_with_lora_equal_one_process(text_file, tmp_path):
    common = ("peft.lora_dropout=0.0", "data.shuffle=false", "trainer.max_steps=3")
    single = cli(tmp_path / "single", text_file, *common, "data.per_device_train_batch_size=4")
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = cli(
        tmp_path / "ddp",
        text_file,
        *common,
        "data.per_device_train_batch_size=2",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "strategy=ddp",
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for step in one:
        assert float(two[step]) == pytest.approx(float(one[step]), rel=1e-5)
    a = load_file(tmp_path / "single" / "hf_model" / "adapter_model.safetensors")
    b = load_file(tmp_path / "ddp" / "hf_model" / "adapter_model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-7)


LORA = ("peft=lora", "peft.r=4", "peft.lora_alpha=8")


def test_evaluate_reads_a_lora_checkpoint_and_the_adapter_export_alike(straight, text_file, tmp_path):
    """``evaluate ckpt_path=... peft=lora`` (the base rebuilt, the adapter from the checkpoint) and ``evaluate
    model.name_or_path=RUN/hf_model`` (transformers loads the base the adapter names, then the adapter) score
    the same weights; another seed builds another base, which the checkpoint refuses."""
    from tests.errors.support import one_line_error

    def evaluate(name, *overrides):
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "hf_lightning.evaluate",
                "+experiment=clm",
                f"data.path={text_file}",
                "data.max_length=32",
                f"hydra.run.dir={tmp_path / name}",
                *overrides,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    from_ckpt = evaluate("ckpt", *LORA, f"ckpt_path={straight / 'checkpoints' / 'last.ckpt'}", *SMALL)
    assert from_ckpt.returncode == 0, from_ckpt.stderr[-3000:]
    from_export = evaluate("export", f"model.name_or_path={straight / 'hf_model'}")
    assert from_export.returncode == 0, from_export.stderr[-3000:]
    a = json.loads((tmp_path / "ckpt" / "eval_metrics.json").read_text())
    b = json.loads((tmp_path / "export" / "eval_metrics.json").read_text())
    assert a["val/loss"] == pytest.approx(b["val/loss"], rel=1e-5)
    wrong = evaluate("wrong", *LORA, "seed=1", f"ckpt_path={straight / 'checkpoints' / 'last.ckpt'}", *SMALL)
    assert "trained on another base model" in one_line_error(wrong)
    # peft's default lora_alpha (32) on an adapter trained with 8: 4x its update, refused
    alpha = evaluate(
        "alpha", "peft=lora", "peft.r=4", f"ckpt_path={straight / 'checkpoints' / 'last.ckpt'}", *SMALL
    )
    assert "peft.lora_alpha=32 but the checkpoint's adapter was trained with 8" in one_line_error(alpha)
