"""Checkpoints of a DeepSpeed ZeRO-2 run on 2 gloo CPU ranks through the command line: killed at seeded points
and resumed with ``ckpt_path=last``, the run equals the one that never stopped.

The same run as the sharded (FSDP2) checkpoint tests (:mod:`tests.integration.test_sharded_checkpoints`: 6
optimizer steps of 2 ranks x 2 rows x 2 micro-batches, a checkpoint folder every 3 steps, a metrics row every
2) under ``strategy=deepspeed_zero2``, with two of that module's kill points (:mod:`tests.kill_points`) drawn
from a seeded RNG (:func:`deepspeed_kill_points`): a SIGKILL inside a step after the first checkpoint (so the
resume loads a DeepSpeed folder) and one halfway through a checkpoint folder (every rank's part written by
the engine, before the manifest and the rename). Compared with
:func:`tests.integration.test_kill_harness.differences`: ``hf_model/`` weights bit for bit, every
deterministic ``metrics.csv`` column, ``final_metrics.json``, the checkpoint folder's names, no temporary
file.

Needs the ``deepspeed`` package; DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.test_kill_harness import EXPECTED_EXIT, differences
from tests.integration.test_sharded_checkpoints import MAX_STEPS, SAVE_EVERY

pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.heavy]


def deepspeed_kill_points(seed: int = 26) -> list[tuple[str, int, str]]:
    """``(point, step, signal)``: a SIGKILL before the update of a step after the first checkpoint, and one
    halfway through a checkpoint folder after the first (the previous one is there to resume from); points
    and steps drawn from ``random.Random(seed)``."""
    import random

    rng = random.Random(seed)
    saves = list(range(SAVE_EVERY, MAX_STEPS + 1, SAVE_EVERY))
    return [
        ("before_update", rng.choice(range(SAVE_EVERY + 1, MAX_STEPS + 1)), "SIGKILL"),
        (rng.choice(["in_save", "in_last_save"]), rng.choice(saves[1:]), "SIGKILL"),
    ]


CASES = deepspeed_kill_points()
DEEPSPEED = ("strategy=deepspeed_zero2", "trainer.devices=2", "trainer.accelerator=cpu")


def case_id(case: tuple[str, int, str]) -> str:
    return "-".join(map(str, (case[2], case[0], case[1])))


@pytest.fixture(scope="module", autouse=True)
def _cpu_accelerator():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_ACCELERATOR", "cpu")
        yield


def cli(run_dir: Path, data: Path, *overrides: str):
    from tests.integration import test_sharded_checkpoints as sharded

    return sharded.cli(run_dir, data, *overrides, strategy=DEEPSPEED)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    import json
    import random

    rng = random.Random(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "tired"]
    path = tmp_path_factory.mktemp("data") / "lines.jsonl"
    with open(path, "w") as fh:
        for _ in range(40):  # 36 train rows, 4 validation rows
            fh.write(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(3, 30)))}) + "\n")
    return path


@pytest.fixture(scope="module")
def straight(text_file, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    proc = cli(run, text_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def runs(text_file, straight, tmp_path_factory):
    root = tmp_path_factory.mktemp("kills")
    outcomes = {}
    for point, step, sig in CASES:
        run_dir = root / case_id((point, step, sig))
        stopped = cli(
            run_dir,
            text_file,
            "+callbacks.kill._target_=tests.kill_points.KillAt",
            f"+callbacks.kill.point={point}",
            f"+callbacks.kill.step={step}",
            f"+callbacks.kill.signal={sig}",
        )
        outcome: dict[str, object] = {"stopped": stopped.returncode, "stopped_err": stopped.stderr[-2000:]}
        if stopped.returncode == EXPECTED_EXIT[sig]:
            outcome["left"] = sorted(os.listdir(run_dir / "checkpoints"))
            resumed = cli(run_dir, text_file, "ckpt_path=last")
            outcome.update(resumed=resumed.returncode, resumed_err=resumed.stderr[-3000:])
        outcomes[(point, step, sig)] = outcome
    return straight, root, outcomes


def test_checkpoints_are_the_engines_folders_with_a_manifest_of_every_file(straight):
    """Each checkpoint is DeepSpeed's folder (``latest``, the model states with Lightning's part, one
    optimizer-state partition per rank) and a manifest of the SHA-256 of every other file; the periodic ones
    rotate as files do."""
    import hashlib

    folder = straight / "checkpoints"
    assert sorted(os.listdir(folder)) == [
        ".hf_lightning.lock",
        "last.ckpt",
        "step000003.ckpt",
        "step000006.ckpt",
    ]
    last = folder / "last.ckpt"
    files = sorted(
        os.path.relpath(os.path.join(root, n), last) for root, _, names in os.walk(last) for n in names
    )
    assert {
        "latest",
        "manifest.sha256",
        "checkpoint/mp_rank_00_model_states.pt",
        "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    } <= set(files), files
    listed = dict(reversed(line.split("  ")) for line in (last / "manifest.sha256").read_text().splitlines())
    assert listed == {
        name: hashlib.sha256((last / name).read_bytes()).hexdigest()
        for name in files
        if name != "manifest.sha256"
    }


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_killed_and_resumed_with_ckpt_path_last_equals_straight(case, runs):
    straight, root, outcomes = runs
    outcome = outcomes[case]
    assert outcome["stopped"] == EXPECTED_EXIT[case[2]], outcome["stopped_err"]
    assert outcome["resumed"] == 0, outcome["resumed_err"]
    assert differences(straight, root / case_id(case)) == []


def test_a_kill_mid_save_leaves_the_previous_checkpoint_and_only_a_temporary_folder(runs):
    """The kill came after every rank's part was written, before the manifest and the rename: the checkpoints
    before it are whole and the half-written one is a temporary folder, which the resume removed."""
    straight, root, outcomes = runs
    case = next(c for c in CASES if c[0] in ("in_save", "in_last_save"))
    left = outcomes[case]["left"]
    assert [n for n in left if n.startswith(".tmp-")], left
    assert "last.ckpt" in left and "step000003.ckpt" in left, left
    assert not [n for n in os.listdir(root / case_id(case) / "checkpoints") if n.startswith(".tmp-")]


def test_the_export_equals_the_weights_of_the_last_checkpoint_loaded_whole(straight):
    """``hf_model/`` loads with ``from_pretrained`` without a missing or unexpected key, and equals the
    weights of ``last.ckpt`` gathered whole from the ranks' partitions (``load_model_weights`` of a DeepSpeed
    folder, as ``evaluate`` and ``resume_weights_only`` read it), at the checkpoint's step."""
    import torch
    import transformers

    from hf_lightning.checkpointing.weights import load_model_weights

    exported, info = transformers.AutoModelForCausalLM.from_pretrained(
        straight / "hf_model", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info

    class Holder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

    holder = Holder(transformers.AutoModelForCausalLM.from_config(exported.config))
    step = load_model_weights(holder, str(straight / "checkpoints" / "last.ckpt"), straight / "hf_model")
    assert step == 6
    for (name, a), b in zip(exported.state_dict().items(), holder.model.state_dict().values()):
        assert torch.equal(a, b), name
