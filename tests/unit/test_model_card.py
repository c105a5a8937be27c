"""``hf_model/README.md``: the card HF ``Trainer.create_model_card`` writes, from the run's config and final
metrics; read back with ``huggingface_hub.ModelCard`` (the hub's own parser)."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

from tests.data_support import tiny_llama


def _cfg(tmp_path, **data):
    return OmegaConf.create(
        {
            "output_dir": str(tmp_path / "my-sft-run"),
            "seed": 7,
            "model": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "data": {
                "path": "trl-lib/Capybara",
                "per_device_train_batch_size": 4,
                "per_device_eval_batch_size": 16,
                "gradient_accumulation_steps": 2,
                **data,
            },
            "optim": {"name": "adamw", "lr": 2e-4, "betas": None, "eps": None, "kwargs": {}},
            "scheduler": {"name": "cosine", "warmup_steps": 5, "warmup_ratio": 0.0},
            "trainer": {"max_steps": 30, "max_epochs": None, "precision": "32-true"},
            "module": {"label_smoothing_factor": 0.0},
        }
    )


def _hyperparameters(text):
    section = text.split("### Training hyperparameters", 1)[1].split("###", 1)[0]
    return dict(re.findall(r"^- (\w+): (.+)$", section, flags=re.M))


def test_the_card_holds_the_runs_settings_and_final_metrics(tmp_path):
    from huggingface_hub import ModelCard

    from hf_lightning.run.model_card import model_card

    run = tmp_path / "my-sft-run"
    run.mkdir()
    # two validations, a train row before each (HF's results table: the newest training loss at each)
    (run / "metrics.csv").write_text(
        "step,train/loss,epoch,lr,val/loss,val/accuracy\n"
        "5,2.5,0.5,0.0002,,\n"
        "5,,,,2.25,0.125\n"
        "10,1.75,1.0,0.0001,,\n"
        "10,,,,1.5,0.375\n"
    )
    final = {"train/loss": 1.75, "val/loss": 1.5, "val/accuracy": 0.375, "epoch": 1.0, "global_step": 10}
    text = model_card(_cfg(tmp_path), tiny_llama(), final, world_size=2, csv_path=str(run / "metrics.csv"))
    path = tmp_path / "README.md"
    path.write_text(text)

    card = ModelCard.load(path)
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers"
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert meta["datasets"] == ["trl-lib/Capybara"]
    assert "generated_from_trainer" in meta["tags"] and "hf_lightning" in meta["tags"]
    # model-index: the task from the model class (LlamaForCausalLM), the hub dataset, HF's metric tags
    (index,) = meta["model-index"]
    assert index["name"] == "my-sft-run"
    (result,) = index["results"]
    assert result["task"]["type"] == "text-generation" and result["dataset"]["type"] == "trl-lib/Capybara"
    assert result["metrics"] == [{"name": "Accuracy", "type": "accuracy", "value": 0.375}]

    # the settings given above, by HF's names; totals by hand: 4 x 2 ranks x 2 accumulation, 16 x 2 ranks
    assert _hyperparameters(card.text) == {
        "learning_rate": "0.0002",
        "train_batch_size": "4",
        "eval_batch_size": "16",
        "seed": "7",
        "distributed_type": "multi-CPU",
        "num_devices": "2",
        "gradient_accumulation_steps": "2",
        "total_train_batch_size": "16",
        "total_eval_batch_size": "32",
        "optimizer": "Use adamw_torch with betas=(0.9,0.999) and epsilon=1e-08 and optimizer_args=No "
        "additional optimizer arguments",
        "lr_scheduler_type": "cosine",
        "lr_scheduler_warmup_steps": "5",
        "training_steps": "30",
    }
    # the final evaluation results, then one table row per validation
    assert "- Loss: 1.5\n- Accuracy: 0.375\n" in card.text
    rows = [line for line in card.text.splitlines() if re.match(r"^\| [\d.]+ ", line)]
    assert [re.split(r"\s*\|\s*", r.strip("| ")) for r in rows] == [
        ["2.5", "0.5", "5", "2.25", "0.125"],
        ["1.75", "1.0", "10", "1.5", "0.375"],
    ]
    assert "- Lightning " in card.text and "- Transformers " in card.text


def test_a_local_model_and_data_file_are_named_in_the_text_only(tmp_path):
    """HF's rules: a local folder is no ``base_model``, a local file no hub ``datasets`` entry; an epoch count
    stands for the steps when no max_steps is given."""
    from huggingface_hub import ModelCard

    from hf_lightning.run.model_card import model_card

    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    cfg = _cfg(tmp_path, path=str(data))
    cfg.model.name_or_path = str(tmp_path)
    cfg.trainer.max_steps = -1
    cfg.trainer.max_epochs = 3
    text = model_card(cfg, tiny_llama(), {"train/loss": 2.0})
    path = tmp_path / "README.md"
    path.write_text(text)
    card = ModelCard.load(path)
    meta = card.data.to_dict()
    assert "base_model" not in meta and "datasets" not in meta
    assert "trained from scratch on the train.jsonl dataset." in card.text
    params = _hyperparameters(card.text)
    assert params["num_epochs"] == "3" and "training_steps" not in params and "num_devices" not in params
