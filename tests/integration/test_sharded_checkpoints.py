"""Checkpoints of a sharded run (``strategy=fsdp``, FSDP2) on 2 gloo CPU ranks: killed at seeded points and
resumed with ``ckpt_path=last``, the run equals the one that never stopped; a checkpoint of 2 ranks resumes on
1.

One straight run (6 optimizer steps: 36 training rows, 2 ranks x 2 rows x 2 micro-batches = 8 rows per
step, an epoch of 5 steps; a checkpoint folder every 3 steps, a metrics row every 2) is the reference. Each
case runs the same command with ``+callbacks.kill`` (:mod:`tests.kill_points`, the points of the kill
harness, drawn from a seeded RNG: :func:`sharded_kill_points`) and then with ``ckpt_path=last``; compared with
:func:`tests.integration.test_kill_harness.differences`: ``hf_model/`` weights bit for bit, every
deterministic ``metrics.csv`` column, ``final_metrics.json``, the checkpoint folder's names, no temporary
file.
"""

from __future__ import annotations

import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.errors.support import one_line_error, run_train_cli
from tests.integration.test_kill_harness import EXPECTED_EXIT, SMALL_MODEL, differences, rows
from tests.sharded_support import sharded

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

MAX_STEPS, SAVE_EVERY, LOG_EVERY = 6, 3, 2


def sharded_kill_points(seed: int = 26) -> list[tuple[str, int, str]]:
    """``(point, step, signal)``: a SIGKILL inside a step, halfway through a checkpoint folder (its shards
    written, not yet renamed into place), during the export, and a SIGTERM after a step; steps drawn from
    ``random.Random(seed)``."""
    rng = random.Random(seed)
    saves = list(range(SAVE_EVERY, MAX_STEPS + 1, SAVE_EVERY))
    return [
        ("before_update", rng.choice(range(2, MAX_STEPS + 1)), "SIGKILL"),
        (rng.choice(["in_save", "in_last_save"]), rng.choice(saves), "SIGKILL"),
        ("export_weights", 0, "SIGKILL"),
        ("step_end", rng.choice(range(2, MAX_STEPS)), "SIGTERM"),
    ]


CASES = sharded_kill_points()


def case_id(case: tuple[str, int, str]) -> str:
    return "-".join(map(str, (case[2], case[0], case[1])))


def cli(
    run_dir: Path,
    data: Path,
    *overrides: str,
    ranks: int = 2,
    batch: int = 2,
    strategy: tuple[str, ...] | None = None,
):
    """The run of this module's cases; ``strategy``: other strategy overrides than FSDP2's on ``ranks``."""
    return run_train_cli(
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={run_dir}",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.max_epochs=null",
        f"trainer.log_every_n_steps={LOG_EVERY}",
        "data.gradient_accumulation_steps=2",
        "trainer.limit_val_batches=1",
        "trainer.val_check_interval=null",
        "trainer.check_val_every_n_epoch=1",
        f"callbacks.model_checkpoint.every_n_train_steps={SAVE_EVERY}",
        "callbacks.model_checkpoint.save_top_k=3",
        f"data.per_device_train_batch_size={batch}",
        "data.per_device_eval_batch_size=4",
        "data.max_length=32",
        "data.validation_split=0.1",
        "trainer.enable_progress_bar=false",
        *SMALL_MODEL,
        *(strategy or sharded(ranks)),
        *overrides,
    )


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    import json

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


def stop_and_resume(
    run_dir: Path, data: Path, case: tuple[str, int, str], *overrides: str
) -> dict[str, object]:
    point, step, sig = case
    stopped = cli(
        run_dir,
        data,
        "+callbacks.kill._target_=tests.kill_points.KillAt",
        f"+callbacks.kill.point={point}",
        f"+callbacks.kill.step={step}",
        f"+callbacks.kill.signal={sig}",
        *overrides,
    )
    outcome: dict[str, object] = {"stopped": stopped.returncode, "stopped_err": stopped.stderr[-2000:]}
    if stopped.returncode != EXPECTED_EXIT[sig]:
        return outcome
    outcome["left"] = sorted(os.listdir(run_dir / "checkpoints"))
    resumed = cli(run_dir, data, "ckpt_path=last", *overrides)
    outcome.update(resumed=resumed.returncode, resumed_err=resumed.stderr[-3000:])
    return outcome


@pytest.fixture(scope="module")
def runs(text_file, straight, tmp_path_factory):
    root = tmp_path_factory.mktemp("kills")
    with ThreadPoolExecutor(max_workers=int(os.environ.get("KILL_HARNESS_WORKERS", "1"))) as pool:
        futures = {c: pool.submit(stop_and_resume, root / case_id(c), text_file, c) for c in CASES}
        outcomes = {c: f.result() for c, f in futures.items()}
    return straight, root, outcomes


def test_checkpoints_are_folders_with_a_manifest_of_every_shard(straight):
    """Each checkpoint is a DCP folder (one shard per rank, the index, meta.pt) whose manifest lists the
    SHA-256 of every other file, as ``sha256sum`` computes them."""
    import hashlib

    folder = straight / "checkpoints"
    assert sorted(os.listdir(folder)) == [
        ".hf_lightning.lock",
        "last.ckpt",
        "step000003.ckpt",
        "step000006.ckpt",
    ]
    last = folder / "last.ckpt"
    files = sorted(os.listdir(last))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.sha256", "meta.pt"]
    listed = dict(reversed(line.split("  ")) for line in (last / "manifest.sha256").read_text().splitlines())
    assert listed == {
        name: hashlib.sha256((last / name).read_bytes()).hexdigest()
        for name in files
        if name != "manifest.sha256"
    }


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_stopped_and_resumed_equals_straight(case, runs):
    straight, root, outcomes = runs
    outcome = outcomes[case]
    assert outcome["stopped"] == EXPECTED_EXIT[case[2]], outcome["stopped_err"]
    assert outcome["resumed"] == 0, outcome["resumed_err"]
    assert differences(straight, root / case_id(case)) == []
    # one resume, one copy of the stopped segment's settings (rank 1 re-runs the command into the folder)
    assert [p.name for p in (root / case_id(case) / ".hydra").glob("previous-*")] == ["previous-1"]


def test_a_kill_mid_save_leaves_the_previous_checkpoint_and_only_a_temporary_folder(runs):
    """The kill came after every rank wrote its shard, before the rename: the previous checkpoints are whole
    and the half-written one is a temporary folder, which the resume removed."""
    straight, root, outcomes = runs
    case = next(c for c in CASES if c[0] in ("in_save", "in_last_save"))
    left = outcomes[case]["left"]
    assert [n for n in left if n.startswith(".tmp-")], left
    assert not [n for n in os.listdir(root / case_id(case) / "checkpoints") if n.startswith(".tmp-")]


def test_the_export_loads_with_from_pretrained_and_matches_a_plain_model(straight):
    """``hf_model/`` is gathered on rank 0 into one folder of whole tensors: ``from_pretrained`` loads it
    without a missing or unexpected key, and it computes what the checkpoint's weights compute."""
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        straight / "hf_model", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    from hf_lightning.checkpointing.sharded import load_sharded_weights

    class Holder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

    fresh = transformers.AutoModelForCausalLM.from_config(model.config)
    load_sharded_weights(Holder(fresh), str(straight / "checkpoints" / "last.ckpt"))
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_checkpoint_of_two_ranks_resumes_on_one(straight, text_file, tmp_path):
    """2 ranks x 2 rows -> 1 rank x 4 rows from step 3: DCP reshards the model and AdamW state, the loader's
    position names the same rows; the final weights equal the 2-rank run's within float rounding (the
    reductions add in another order) and the rows after step 3 carry the same losses."""
    from safetensors.torch import load_file

    run = tmp_path / "one"
    proc = cli(run, text_file, f"ckpt_path={straight / 'checkpoints' / 'step000003.ckpt'}", ranks=1, batch=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(straight / "hf_model" / "model.safetensors")
    b = load_file(run / "hf_model" / "model.safetensors")
    assert a.keys() == b.keys()
    largest = max(t.abs().max().item() for t in a.values())
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5 * largest
    after = [r for r in rows(straight) if int(r["step"]) > 3]
    resumed = rows(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in after]
    for x, y in zip(after, resumed):
        for key in ("train/loss", "val/loss"):
            if key in x:
                assert float(y[key]) == pytest.approx(float(x[key]), rel=1e-5), (key, x["step"])


def test_a_checkpoint_of_one_rank_resumes_on_two(straight, text_file, tmp_path):
    """1 rank x 4 rows -> 2 ranks x 2 rows from step 3: the one shard is split over two ranks (model and
    AdamW state), the loader's position names the same rows; the end equals the straight 2-rank run within
    float rounding."""
    from safetensors.torch import load_file

    one, two = tmp_path / "one", tmp_path / "two"
    proc = cli(one, text_file, ranks=1, batch=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(one / "checkpoints" / "step000003.ckpt")) == [
        ".metadata",
        "__0_0.distcp",
        "manifest.sha256",
        "meta.pt",
    ]
    proc = cli(two, text_file, f"ckpt_path={one / 'checkpoints' / 'step000003.ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(straight / "hf_model" / "model.safetensors")
    b = load_file(two / "hf_model" / "model.safetensors")
    assert a.keys() == b.keys()
    largest = max(t.abs().max().item() for t in a.values())
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5 * largest
    after = [r for r in rows(straight) if int(r["step"]) > 3]
    resumed = rows(two)
    assert [r["step"] for r in resumed] == [r["step"] for r in after]
    for x, y in zip(after, resumed):
        for key in ("train/loss", "val/loss"):
            if key in x:
                assert float(y[key]) == pytest.approx(float(x[key]), rel=1e-5), (key, x["step"])


def test_a_resume_on_other_ranks_with_other_rows_per_step_is_refused(straight, text_file, tmp_path):
    """1 rank x 2 rows from a checkpoint of 2 ranks x 2 rows: one line saying why and what to set."""
    ckpt = straight / "checkpoints" / "step000003.ckpt"
    line = one_line_error(cli(tmp_path / "r", text_file, f"ckpt_path={ckpt}", ranks=1))
    assert line == (
        f"hf_lightning: error: ckpt_path={ckpt}: cannot resume: it was written by 2 ranks x 2 rows x 2 "
        "micro-batches = 8 rows per optimizer step, and this run takes 4: the checkpoint's data position "
        "(windows consumed) would name other rows; set data.per_device_train_batch_size=4 to keep 8 rows per "
        "step"
    )


def test_a_damaged_shard_is_refused_naming_the_newest_intact_checkpoint(straight, text_file, tmp_path):
    """A byte flipped in rank 1's shard of ``last.ckpt``: ``ckpt_path=last`` is refused in one line naming
    the file and the newest intact checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shard = run / "checkpoints" / "last.ckpt" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    last, named = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "step000006.ckpt"
    assert one_line_error(cli(run, text_file, "ckpt_path=last")) == (
        f"hf_lightning: error: ckpt_path=last: cannot resume: {last} is damaged: the SHA-256 of "
        "__1_0.distcp does not match the one written with it (manifest.sha256), so its bytes changed after "
        "it was saved (a failing disk or an incomplete copy); the newest intact checkpoint there is "
        f"{named} (step 6): resume from it with ckpt_path={named}"
    )


def test_a_resume_from_an_earlier_checkpoint_of_the_run_replaces_its_last_folder(
    straight, text_file, tmp_path
):
    """``ckpt_path=checkpoints/step000003.ckpt`` in the run's own folder, whose ``last.ckpt`` (a folder, step
    6) the restored state does not name: it is adopted and replaced by the resumed run's (no
    ``last-v1.ckpt``), and the run equals the straight one. (The run is its own, not a copy: a moved or copied
    run folder restores no checkpoint bookkeeping.)"""
    run = tmp_path / "run"
    proc = cli(run, text_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = cli(run, text_file, f"ckpt_path={run / 'checkpoints' / 'step000003.ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(run / "checkpoints")) == sorted(os.listdir(straight / "checkpoints"))
    assert differences(straight, run) == []


def checkpoint_weights(folder: Path, like: Path) -> dict[str, torch.Tensor]:
    """The HF model's weights in the checkpoint folder ``folder``, read into a plain model built from the
    config of the export ``like``."""
    import transformers

    from hf_lightning.checkpointing.sharded import load_sharded_weights

    class Holder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

    fresh = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(like))
    load_sharded_weights(Holder(fresh), str(folder))
    return fresh.state_dict()


def test_load_best_model_at_end_exports_an_earlier_best_checkpoint(text_file, tmp_path):
    """A learning rate high enough that the validation loss rises again: ``hf_model/`` holds the weights of
    ``best.ckpt``, a folder written at the save step with the lowest ``val/loss`` in ``metrics.csv`` (not the
    last step), and ``last.ckpt`` keeps the final, other weights."""
    from safetensors.torch import load_file

    run = tmp_path / "best"
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={text_file}",
        f"hydra.run.dir={run}",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.max_epochs=null",
        "data.gradient_accumulation_steps=2",
        "data.per_device_train_batch_size=2",
        "data.per_device_eval_batch_size=4",
        "data.max_length=32",
        "data.validation_split=0.1",
        "trainer.enable_progress_bar=false",
        "eval_steps=2",
        "save_steps=2",
        "logging_steps=2",
        "load_best_model_at_end=true",
        "optim.lr=0.05",
        "scheduler.warmup_steps=0",
        *SMALL_MODEL,
        *sharded(2),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluated = {int(r["step"]): float(r["val/loss"]) for r in rows(run) if r.get("val/loss")}
    assert sorted(evaluated) == [2, 4, 6]
    best_step = min(evaluated, key=evaluated.get)
    assert best_step != MAX_STEPS, evaluated  # the case under test: an earlier checkpoint is loaded
    best = run / "checkpoints" / "best.ckpt"
    assert torch.load(best / "meta.pt", weights_only=False)["global_step"] == best_step
    exported = load_file(run / "hf_model" / "model.safetensors")
    in_best = checkpoint_weights(best, run / "hf_model")
    final = checkpoint_weights(run / "checkpoints" / "last.ckpt", run / "hf_model")
    for name, tensor in exported.items():
        assert torch.equal(tensor, in_best[name]), name
    assert any(not torch.equal(t, final[n]) for n, t in exported.items())
    import json

    assert json.loads((run / "final_metrics.json").read_text())["best_model_step"] == best_step


def test_a_lora_run_killed_and_resumed_equals_the_straight_one(text_file, tmp_path):
    """``peft=lora`` under FSDP2: the checkpoint folder holds the adapter's weights only (the frozen base is
    built again), a SIGKILL in step 5 and ``ckpt_path=last`` from step 3 end with the straight run's adapter,
    bit for bit, and its ``metrics.csv`` rows."""
    from safetensors.torch import load_file

    from hf_lightning.checkpointing.sharded import stored_keys

    lora = ("peft=lora", "peft.lora_dropout=0")
    straight_run, run = tmp_path / "straight", tmp_path / "stopped"
    proc = cli(straight_run, text_file, *lora)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = [
        k for k in stored_keys(str(straight_run / "checkpoints" / "last.ckpt")) if k.startswith("state_")
    ]
    assert weights and all("lora_" in k for k in weights), weights
    kill = ("before_update", 5, "SIGKILL")
    outcome = stop_and_resume(run, text_file, kill, *lora)
    assert outcome["stopped"] == EXPECTED_EXIT["SIGKILL"], outcome["stopped_err"]
    assert outcome["resumed"] == 0, outcome["resumed_err"]
    a = load_file(straight_run / "hf_model" / "adapter_model.safetensors")
    b = load_file(run / "hf_model" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert rows(run) == rows(straight_run)
