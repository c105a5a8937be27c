"""``python -m hf_lightning.migrate`` on dumps written by transformers itself.

Each test builds ``TrainingArguments`` here and saves both forms a user has: the JSON of ``to_json_string()``
and the ``training_args.bin`` that ``Trainer.save_model`` writes. The expected overrides are read from the
arguments object, not from our output.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest


@pytest.fixture
def dumps(tmp_path, word_tokenizer):
    """``(args, json path, training_args.bin path)`` of one non-default ``TrainingArguments``."""
    from transformers import Trainer, TrainingArguments

    from tests.data_support import tiny_llama

    args = TrainingArguments(
        output_dir=str(tmp_path / "hf_out"),
        max_steps=60,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=2,
        learning_rate=5e-4,
        warmup_steps=0.1,
        adam_beta2=0.95,
        lr_scheduler_type="cosine",
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="steps",
        save_steps=20,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        logging_steps=5,
        logging_first_step=True,
        train_sampling_strategy="sequential",
        neftune_noise_alpha=5.0,
        eval_delay=3,
        report_to="none",
        use_cpu=True,
        seed=7,
    )
    json_path = tmp_path / "args.json"
    json_path.write_text(args.to_json_string())
    rows = [{"input_ids": [4, 5, 6]}]  # Trainer refuses an eval_strategy without evaluation data
    Trainer(model=tiny_llama(), args=args, eval_dataset=rows).save_model(str(tmp_path / "saved"))
    return args, json_path, tmp_path / "saved" / "training_args.bin"


def migrate(*argv: str, capsys) -> tuple[int, str, str]:
    from hf_lightning.migrate import main

    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def command_words(out: str) -> list[str]:
    """The words of the printed command (its lines end in `` \\``; the ``#`` lines are comments)."""
    lines = [line.removesuffix(" \\") for line in out.splitlines() if not line.startswith("#")]
    return shlex.split(" ".join(lines))


def test_both_dumps_give_the_same_command_with_hf_values(dumps, capsys):
    args, json_path, bin_path = dumps
    assert bin_path.is_file()  # written by transformers' Trainer
    status, from_json, _ = migrate(str(json_path), capsys=capsys)
    assert status == 0
    status, from_bin, _ = migrate(str(bin_path), capsys=capsys)
    assert status == 0 and from_bin == from_json

    words = command_words(from_json)
    assert words[:4] == ["python", "-m", "hf_lightning.train", "+experiment=clm"]
    expected = [
        f"trainer.max_steps={args.max_steps}",
        "trainer.max_epochs=null",
        f"data.per_device_train_batch_size={args.per_device_train_batch_size}",
        f"data.per_device_eval_batch_size={args.per_device_eval_batch_size}",
        f"data.gradient_accumulation_steps={args.gradient_accumulation_steps}",
        f"optim.lr={args.learning_rate!r}",
        f"optim.betas=[{args.adam_beta1},{args.adam_beta2}]",
        f"scheduler.name={args.lr_scheduler_type.value}",
        f"scheduler.warmup_ratio={args.warmup_steps}",
        f"eval_steps={args.eval_steps}",
        f"save_steps={args.save_steps}",
        f"callbacks.model_checkpoint.save_top_k={args.save_total_limit}",
        f"logging_steps={args.logging_steps}",
        "logging_first_step=true",
        "load_best_model_at_end=true",
        f"metric_for_best_model={args.metric_for_best_model}",
        f"greater_is_better={str(args.greater_is_better).lower()}",  # HF's default, resolved by transformers
        f"seed={args.seed}",
        "data.shuffle=false",
    ]
    for word in expected:
        assert word in words, word
    dropped = [line for line in from_json.splitlines() if line.startswith("#   ")]
    assert sorted(line.split("=", 1)[0].strip("# ") for line in dropped) == [
        "eval_delay",
        "neftune_noise_alpha",
    ]
    assert "#   neftune_noise_alpha=5.0: NEFTune noise is not supported" in dropped


def test_the_command_composes_to_hf_values(dumps, capsys, tmp_path):
    from hf_lightning.config.compose import compose_train

    args, json_path, _ = dumps
    status, out, _ = migrate(str(json_path), "model.name_or_path=m", "data.path=d.jsonl", capsys=capsys)
    assert status == 0 and "# add the model and data" not in out
    words = command_words(out)[3:]
    cfg = compose_train([w for w in words if not w.startswith("hydra.")], output_dir=tmp_path)
    assert cfg.optim.lr == args.learning_rate and cfg.optim.betas == [args.adam_beta1, args.adam_beta2]
    assert cfg.scheduler.warmup_ratio == args.warmup_steps and cfg.scheduler.warmup_steps == 0
    assert cfg.data.gradient_accumulation_steps == args.gradient_accumulation_steps
    assert (cfg.eval_steps, cfg.save_steps, cfg.logging_steps) == (args.eval_steps, args.save_steps, 5)
    assert cfg.load_best_model_at_end is True and cfg.greater_is_better is False


def test_a_dump_at_hf_defaults_lists_nothing(tmp_path, capsys):
    from transformers import TrainingArguments

    path = tmp_path / "args.json"
    path.write_text(TrainingArguments(output_dir=str(tmp_path / "o")).to_json_string())
    status, out, _ = migrate(str(path), capsys=capsys)
    assert status == 0 and "not carried over" not in out
    # HF's defaults written out where ours differ: 3 epochs, 5e-5, no evaluation, a save every 500 steps
    for word in (
        "trainer.max_epochs=3",
        "optim.lr=5e-05",
        "eval_strategy=no",
        "save_steps=500",
        "logging_steps=500",
    ):
        assert word in out, word


@pytest.mark.slow
def test_bad_input_is_one_line_and_status_2(tmp_path):
    import torch

    class Payload:
        def __reduce__(self):
            return (print, ("a pickle ran code",))

    evil = tmp_path / "training_args.bin"
    torch.save(Payload(), evil)
    text = tmp_path / "notes.txt"
    text.write_text("learning_rate: 5e-5\n")
    cases = {
        str(tmp_path / "missing.json"): "missing.json: no such file",
        str(evil): "training_args.bin: holds builtins.print, which migrate does not unpickle",
        str(text): "notes.txt: neither JSON nor a training_args.bin",
    }
    for path, message in cases.items():
        proc = subprocess.run(
            [sys.executable, "-m", "hf_lightning.migrate", path], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hf_lightning: error: ") and message in lines[0], lines
        assert proc.stdout == "" and "a pickle ran code" not in proc.stdout + proc.stderr
