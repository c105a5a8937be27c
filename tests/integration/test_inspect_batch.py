"""``python -m hf_lightning.inspect_batch``: the same config and overrides as train, one batch printed."""

from __future__ import annotations

import os
import re

import pytest

from tests.fork_server import run_module

pytestmark = pytest.mark.slow


def run(*overrides, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = [*overrides, f"hydra.run.dir={cwd}"]
    return run_module("hf_lightning.inspect_batch", args, env=env, cwd=os.getcwd(), timeout=600)


def test_sft_batch_is_printed_with_marked_spans(tmp_path):
    proc = run(
        "+experiment=sft", "data.per_device_train_batch_size=4", "data.group_by_length=true", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "format: messages" in out
    # keys are padded to the longest one (the window keys of hf_lightning.data.sampling)
    assert re.search(r"^  input_ids +\(4, \d+\)  torch.int64$", out, re.M)
    for key in ("num_items_in_batch", "num_items_in_micro_batch", "num_batches_in_window"):
        assert re.search(rf"^  {key} +int = \d+$", out, re.M), key
    assert "labels -100: " in out and "padding: " in out
    assert "dropped columns: {'train': ['messages'], 'validation': ['messages']}" in out
    # group_by_length puts the longest conversation first: truncated at max_length=256, inside a reply
    assert "<|im_start|>assistant\n[[" in out and out.rstrip().endswith("]]")
    assert "first example (256 tokens;" in out


def test_bad_override_is_one_clear_line(tmp_path):
    proc = run("+experiment=sft", "+data.pack=true", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown config key data.pack" in proc.stderr
