"""Two-process CPU DDP through the CLI prints one run: rank 0 speaks for it, one ``done:``
line with the run's totals (both ranks' real tokens: 2 steps x 2 ranks x 2 packed rows x (40 + EOS) tokens,
counted by hand), no line said by each rank, and no Lightning ``sync_dist`` advice for validation values that
are already synced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.log_support import DOC_TOKENS, equal_length_docs, gpt2_tokenizer, save_gpt2

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def test_ddp_prints_one_run_with_its_totals(shared_data, tmp_path):
    tok = gpt2_tokenizer(shared_data)
    model = save_gpt2(tmp_path / "gpt2", tok)
    data = equal_length_docs(shared_data, tok, tmp_path / "docs.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lightning.train",
            "+experiment=clm",
            f"model.name_or_path={model}",
            f"data.path={data}",
            "data.max_length=64",
            "data.packing=bfd",
            "data.per_device_train_batch_size=2",
            "trainer.max_steps=2",
            "trainer.val_check_interval=1",
            "trainer.check_val_every_n_epoch=null",
            "trainer.limit_val_batches=1",
            "trainer.enable_model_summary=false",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "strategy=ddp",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    done = [line for line in out.splitlines() if "] - done: " in line]
    assert len(done) == 1, out[-3000:]
    assert f" {2 * 2 * 2 * (DOC_TOKENS + 1)} real tokens trained at " in done[0]
    assert out.count("] - model: GPT2LMHeadModel") == 1
    assert "sync_dist" not in out
    log_file = (tmp_path / "run" / "train.log").read_text()
    assert log_file.count("] - done: ") == 1
