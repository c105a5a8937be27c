"""HFDataModule and HFLightningModule in a project of lightning-hydra-template's shape, from configs alone.

The project is laid out here as that template lays itself out (``configs/{train,eval}.yaml`` with the
``data``, ``model``, ``trainer``, ``logger``, ``callbacks``, ``paths`` groups; ``src/train.py`` and
``src/eval.py`` that instantiate every node with ``hydra.utils.instantiate`` and call ``trainer.fit`` /
``trainer.test``), with our two files from ``examples/lightning-hydra-template/configs`` copied in unchanged.
``train.py`` runs fit then test under the template's ``trainer=ddp_sim`` (``ddp_spawn``, 2 CPU processes)
with its CSV logger, and logs the hyperparameters from the main process first, as the template does;
``eval.py`` then tests the checkpoint on one process. The expected test loss is the HF model's own loss on
the test rows, with the checkpoint's weights loaded by hand.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers

from tests.data_support import REPO, tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SHIPPED = REPO / "examples" / "lightning-hydra-template" / "configs"
TRAIN = ["a b c d e", "f g h", "i j k l", "m n o", "p q r s t u", "v w x", "y z a b", "c d e f", "g h i"] + [
    "j k l m",
    "n o p",
    "q r s t",
]
VAL = ["a c e g", "b d f"]
TEST = ["h j l n p", "r t v", "x z"]

CONFIGS = {
    "train.yaml": """
        # @package _global_
        defaults:
          - _self_
          - data: hf
          - model: hf
          - callbacks: default
          - logger: null
          - trainer: default
          - paths: default
        task_name: train
        train: true
        test: true
        ckpt_path: null
        seed: 12
    """,
    "eval.yaml": """
        # @package _global_
        defaults:
          - _self_
          - data: hf
          - model: hf
          - logger: null
          - trainer: default
          - paths: default
        task_name: eval
        ckpt_path: ???
    """,
    "trainer/default.yaml": """
        _target_: lightning.pytorch.trainer.Trainer
        default_root_dir: ${paths.output_dir}
        min_epochs: 1
        max_epochs: 10
        accelerator: cpu
        devices: 1
        check_val_every_n_epoch: 1
        deterministic: false
    """,
    "trainer/ddp_sim.yaml": """
        defaults:
          - default
        accelerator: cpu
        devices: 2
        strategy: ddp_spawn
    """,
    "logger/csv.yaml": """
        csv:
          _target_: lightning.pytorch.loggers.csv_logs.CSVLogger
          save_dir: ${paths.output_dir}
          name: "csv/"
          prefix: ""
    """,
    "callbacks/default.yaml": """
        defaults:
          - model_checkpoint
          - _self_
        model_checkpoint:
          dirpath: ${paths.output_dir}/checkpoints
          filename: "epoch_{epoch:03d}"
          monitor: val/loss
          mode: min
          save_last: true
          auto_insert_metric_name: false
    """,
    "callbacks/model_checkpoint.yaml": """
        model_checkpoint:
          _target_: lightning.pytorch.callbacks.ModelCheckpoint
          dirpath: null
          filename: null
          monitor: null
          save_last: null
          save_top_k: 1
          mode: min
          auto_insert_metric_name: true
    """,
    "paths/default.yaml": """
        root_dir: ${oc.env:PROJECT_ROOT}
        data_dir: ${paths.root_dir}/data/
        log_dir: ${paths.root_dir}/logs/
        output_dir: ${hydra:runtime.output_dir}
    """,
}

COMMON = '''
    from typing import Any

    import hydra
    import lightning as L
    from omegaconf import DictConfig, OmegaConf


    def instantiate_all(node: Any) -> list:
        """The template's instantiate_callbacks / instantiate_loggers."""
        nodes = [c for c in (node or {}).values() if isinstance(c, DictConfig) and "_target_" in c]
        return [hydra.utils.instantiate(c) for c in nodes]


    def log_hyperparameters(cfg: DictConfig, trainer: L.Trainer) -> None:
        """The template's log_hyperparameters: from the main process, before anything runs."""
        for logger in trainer.loggers:
            logger.log_hyperparams({k: OmegaConf.to_container(cfg[k]) for k in ("model", "data")})
'''

SCRIPTS = {
    "train.py": COMMON
    + """

    def train(cfg: DictConfig) -> dict:
        if cfg.get("seed"):
            L.seed_everything(cfg.seed, workers=True)
        datamodule = hydra.utils.instantiate(cfg.data)
        model = hydra.utils.instantiate(cfg.model)
        callbacks = instantiate_all(cfg.get("callbacks"))
        logger = instantiate_all(cfg.get("logger"))
        trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
        log_hyperparameters(cfg, trainer)
        if cfg.get("train"):
            trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        train_metrics = dict(trainer.callback_metrics)
        if cfg.get("test"):
            ckpt_path = trainer.checkpoint_callback.best_model_path or None
            trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt_path)
        return {**train_metrics, **trainer.callback_metrics}


    @hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
    def main(cfg: DictConfig) -> None:
        train(cfg)


    if __name__ == "__main__":
        main()
""",
    "eval.py": COMMON
    + """

    def evaluate(cfg: DictConfig) -> dict:
        assert cfg.ckpt_path
        datamodule = hydra.utils.instantiate(cfg.data)
        model = hydra.utils.instantiate(cfg.model)
        logger = instantiate_all(cfg.get("logger"))
        trainer = hydra.utils.instantiate(cfg.trainer, logger=logger)
        log_hyperparameters(cfg, trainer)
        trainer.test(model=model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
        return dict(trainer.callback_metrics)


    @hydra.main(version_base="1.3", config_path="../configs", config_name="eval.yaml")
    def main(cfg: DictConfig) -> None:
        evaluate(cfg)


    if __name__ == "__main__":
        main()
""",
}


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


@pytest.fixture
def project(tmp_path, word_tokenizer):
    root = tmp_path / "project"
    for name, text in CONFIGS.items():
        (root / "configs" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "configs" / name).write_text(textwrap.dedent(text))
    for group in ("data", "model"):
        (root / "configs" / group).mkdir(parents=True, exist_ok=True)
        shutil.copy(SHIPPED / group / "hf.yaml", root / "configs" / group / "hf.yaml")
    (root / "src").mkdir()
    for name, text in SCRIPTS.items():
        (root / "src" / name).write_text(textwrap.dedent(text))
    model_dir = tmp_path / "tiny_model"
    tiny_llama(len(word_tokenizer)).save_pretrained(model_dir)
    word_tokenizer.save_pretrained(model_dir)
    data = tmp_path / "data"
    data.mkdir()
    overrides = [
        f"model.model={model_dir}",
        f"data.path={write_jsonl(data / 'train.jsonl', TRAIN)}",
        f"data.validation_path={write_jsonl(data / 'val.jsonl', VAL)}",
        f"data.test_path={write_jsonl(data / 'test.jsonl', TEST)}",
        "data.max_length=16",
        "data.per_device_train_batch_size=2",
        "data.per_device_eval_batch_size=2",
        "trainer.max_epochs=1",
        "data.gradient_accumulation_steps=2",
        "+trainer.log_every_n_steps=1",
        "+trainer.num_sanity_val_steps=0",
        "+trainer.enable_progress_bar=false",
        "+trainer.enable_model_summary=false",
    ]
    return root, model_dir, overrides


def run(root, script, *args, timeout=300):
    env = {
        **os.environ,
        "PROJECT_ROOT": str(root),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, f"src/{script}", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def csv_rows(run_dir):
    (path,) = run_dir.glob("csv/version_*/metrics.csv")
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def hand_test_loss(model_dir, ckpt, tokenizer) -> float:
    """The checkpoint's weights in the HF model, its own loss per test row, token-weighted."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    total, count = 0.0, 0
    with torch.no_grad():
        for text in TEST:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            total += float(model.eval()(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    return total / count


def test_train_then_test_under_ddp_spawn_and_eval_from_configs_alone(project, word_tokenizer):
    root, model_dir, overrides = project
    train_dir = root / "logs" / "train"
    # the template's trainer=ddp_sim logger=csv: fit and test each run in 2 new processes, whose CSV loggers
    # are copies of the main process's
    run(root, "train.py", *overrides, "trainer=ddp_sim", "logger=csv", f"hydra.run.dir={train_dir}")
    rows = csv_rows(train_dir)
    # 12 rows on 2 ranks: 6 each, 3 micro-batches of 2, windows of 2 and 1: 2 optimizer steps, each logged
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == [1, 2]
    assert [r for r in rows if r.get("val/loss")]
    (tested,) = [r for r in rows if r.get("test/loss")]  # the test workers' row joined the training rows
    (best,) = (train_dir / "checkpoints").glob("epoch_*.ckpt")
    expected = hand_test_loss(model_dir, best, word_tokenizer)
    assert float(tested["test/loss"]) == pytest.approx(expected, rel=1e-5)

    eval_dir = root / "logs" / "eval"
    run(root, "eval.py", *overrides, f"ckpt_path={best}", "logger=csv", f"hydra.run.dir={eval_dir}")
    (evaluated,) = [r for r in csv_rows(eval_dir) if r.get("test/loss")]
    assert float(evaluated["test/loss"]) == pytest.approx(expected, rel=1e-5)
