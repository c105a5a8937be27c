"""HF's ``eval_steps``, ``save_steps``, ``logging_steps`` and ``load_best_model_at_end``, side by side with HF
``Trainer``.

One job on both sides: a tiny Llama saved to a folder, 30 rows of real web text (shared/data c4-demo) in
order, micro-batch 2 x accumulation 2 (15 micro-batches, so 8 optimizer steps per epoch, the last window of
each epoch a single micro-batch), ``max_steps=19`` (three epochs, 19 not a multiple of ``eval_steps=5``). HF
evaluates at 5, 10, 15 and the final 19, saves at 10 and 19, logs ``loss`` at 1 (``logging_first_step``), 3,
6, ..., 18 and its run summary at 19. Lightning's ``val_check_interval=10`` (the old mapping, ``N x K``
micro-batches) would validate at micro-batches 10, 20, 30: steps 5, 11 (mid-window) and 16.
"""

from __future__ import annotations

import csv
import json
import re
from itertools import islice

import pytest
import torch

pytestmark = pytest.mark.slow

LR, STEPS, ACCUMULATION, BATCH = 3e-3, 19, 2, 2


@pytest.fixture
def job(tmp_path, default_tokenizer, shared_data):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(default_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=default_tokenizer.pad_token_id,
    )
    folder = tmp_path / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    default_tokenizer.save_pretrained(folder)
    with open(f"{shared_data}/c4-demo/c4_demo.jsonl") as fh:
        rows = [json.loads(line)["text"] for line in islice(fh, 38)]
    for name, part in (("train", rows[:30]), ("val", rows[30:])):
        with open(tmp_path / f"{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in part)
    return folder, tmp_path / "train.jsonl", tmp_path / "val.jsonl"


def run_hf(folder, train_file, val_file, out, **schedule):
    """HF ``Trainer`` on the job: ``(trainer, evaluated steps -> eval_loss, saved steps, loss-logged
    steps)``."""
    import datasets
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")

    def load(path):
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        return ds.map(lambda r: tokenizer(r["text"], truncation=True, max_length=32), remove_columns=["text"])

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        per_device_eval_batch_size=8,
        learning_rate=LR,
        weight_decay=0.0,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        train_sampling_strategy="sequential",
        report_to="none",
        use_cpu=True,
        seed=42,
        disable_tqdm=True,
        **schedule,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=load(train_file),
        eval_dataset=load(val_file),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()
    history = trainer.state.log_history
    evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    logged = [h["step"] for h in history if "loss" in h]
    summary = [h["step"] for h in history if "train_loss" in h]
    return trainer, evals, saved, logged + summary


def run_ours(compose_cfg, tmp_path, folder, train_file, val_file, *overrides):
    """``train()`` on the job: ``(final metrics, validated steps -> val/loss, saved steps, train/loss
    steps)``."""
    from hf_lightning.train import train

    cfg = compose_cfg(
        "+experiment=clm",
        f"model.name_or_path={folder}",
        f"data.path={train_file}",
        f"data.validation_path={val_file}",
        "data.shuffle=false",
        "data.max_length=32",
        f"data.per_device_train_batch_size={BATCH}",
        "data.per_device_eval_batch_size=8",
        f"trainer.max_steps={STEPS}",
        "trainer.max_epochs=null",
        f"data.gradient_accumulation_steps={ACCUMULATION}",
        "trainer.limit_val_batches=null",
        "module.max_grad_norm=1.0",
        f"optim.lr={LR}",
        "optim.weight_decay=0.0",
        "optim.fused=false",
        "scheduler.name=linear",
        "scheduler.warmup_steps=0",
        "callbacks.model_checkpoint.save_top_k=-1",
        *overrides,
    )
    metrics, _ = train(cfg)
    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    evals = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    logged = [int(r["step"]) for r in rows if r.get("train/loss")]
    saved = sorted(
        int(re.search(r"\d+", p.name).group()) for p in (tmp_path / "checkpoints").glob("step*.ckpt")
    )
    return metrics, evals, saved, logged


def model_weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def checkpoint_weights(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    return state["global_step"], {
        k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")
    }


def test_eval_save_log_steps_and_best_model_match_hf_trainer(job, compose_cfg, tmp_path):
    folder, train_file, val_file = job
    hf, hf_evals, hf_saved, hf_logged = run_hf(
        folder,
        train_file,
        val_file,
        tmp_path / "hf",
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="steps",
        save_steps=10,
        logging_steps=3,
        logging_first_step=True,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    # HF's own rules, checked by hand: multiples over the whole run plus the final step
    assert sorted(hf_evals) == [5, 10, 15, 19] and hf_saved == [10, 19]
    assert hf_logged == [1, 3, 6, 9, 12, 15, 18, 19]

    metrics, evals, saved, logged = run_ours(
        compose_cfg,
        tmp_path,
        folder,
        train_file,
        val_file,
        "eval_steps=5",
        "save_steps=10",
        "logging_steps=3",
        "logging_first_step=true",
        "load_best_model_at_end=true",
        "metric_for_best_model=eval_loss",
    )
    assert sorted(evals) == sorted(hf_evals)
    assert saved == hf_saved
    assert (
        logged == hf_logged
    )  # train/loss rows at HF's loss steps; the last row is the tail, at HF's summary step
    for step in evals:  # the same job on both sides
        assert evals[step] == pytest.approx(hf_evals[step], rel=1e-4), step

    hf_best = int(hf.state.best_model_checkpoint.rsplit("-", 1)[1])
    assert metrics["best_model_step"] == hf_best
    assert metrics["best_metric"] == pytest.approx(hf_evals[hf_best], rel=1e-4)
    step, best = checkpoint_weights(tmp_path / "checkpoints" / "best.ckpt")
    assert step == hf_best
    exported = model_weights(tmp_path / "hf_model")
    for name, tensor in best.items():
        torch.testing.assert_close(exported[name], tensor, rtol=0, atol=0, msg=name)


def test_load_best_model_at_end_exports_an_earlier_checkpoint_like_hf_trainer(job, compose_cfg, tmp_path):
    """``greater_is_better=true`` on the loss: the first evaluation (step 5, saved) stays the best on both
    sides, so HF loads ``checkpoint-5`` and ``hf_model/`` must hold step 5's weights, not the final ones."""
    folder, train_file, val_file = job
    hf, hf_evals, hf_saved, _ = run_hf(
        folder,
        train_file,
        val_file,
        tmp_path / "hf",
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="steps",
        save_steps=5,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=True,
    )
    hf_best = int(hf.state.best_model_checkpoint.rsplit("-", 1)[1])
    assert (
        hf_best == max(hf_evals, key=hf_evals.get) != STEPS
    )  # the premise: an earlier checkpoint is the best

    metrics, evals, saved, _ = run_ours(
        compose_cfg,
        tmp_path,
        folder,
        train_file,
        val_file,
        "eval_steps=5",
        "load_best_model_at_end=true",
        "metric_for_best_model=loss",
        "greater_is_better=true",
    )
    assert saved == hf_saved == [5, 10, 15, 19]  # saves follow the evaluations when save_steps is not given
    assert metrics["best_model_step"] == hf_best
    step, best = checkpoint_weights(tmp_path / "checkpoints" / f"step{hf_best:06d}.ckpt")
    exported = model_weights(tmp_path / "hf_model")
    for name, tensor in best.items():
        torch.testing.assert_close(exported[name], tensor, rtol=0, atol=0, msg=name)
    # and they are HF's best model's weights, up to the two sides' float rounding
    hf_state = {k: v.detach() for k, v in hf.model.state_dict().items()}
    for name, tensor in best.items():
        torch.testing.assert_close(tensor, hf_state[name], rtol=1e-3, atol=1e-4, msg=name)
