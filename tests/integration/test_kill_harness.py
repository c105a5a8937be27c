"""The kill harness: a run killed at a seeded point and resumed with ``ckpt_path=last`` equals a run that
never stopped, in its weights and in every deterministic column of every ``metrics.csv`` row.

One straight run (14 optimizer steps over three epochs: 36 training rows in micro-batches of 4, accumulation
2, validation at each epoch end and of the final weights, a row every 4 steps, checkpoints every 3 steps with
``save_top_k=3``) is the reference. Each case runs the same command with ``+callbacks.kill`` (see
:mod:`tests.kill_points`), which stops the process at one point: SIGKILL anywhere from start-up to the last
byte of ``final_metrics.json``, or SIGTERM / SIGINT (a graceful stop). The same command plus
``ckpt_path=last`` then finishes the run. The points are drawn once from a seeded RNG (:func:`kill_points`),
so a failure reruns as is.

Compared with the straight run: ``hf_model/`` weights (bit for bit) and file names; ``metrics.csv`` rows in
order, every column except the wall-clock ones (``throughput/*_per_s``, ``throughput/mfu``);
``final_metrics.json`` on the same keys; the checkpoint folder's file names (``save_top_k`` holds, no ``-v1``
copies); no temporary file left anywhere in the run folder.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.errors.support import run_train_cli

pytestmark = pytest.mark.slow

SMALL_MODEL = (
    "model.config.hidden_size=64",
    "model.config.intermediate_size=128",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=2",
    "model.config.num_key_value_heads=2",
)
MAX_STEPS = 14
LOG_EVERY = 4
SAVE_EVERY = 3
# 36 training rows / 4 = 9 micro-batches per epoch, windows of 2: steps 1-5, 6-10, 11-14; validation at 5, 10,
# 14
EPOCH_ENDS = (5, 10)


def kill_points(seed: int = 15) -> list[tuple[str, int, str]]:
    """``(point, step, signal)`` of every case, drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    steps = list(range(1, MAX_STEPS + 1))
    windows = [
        s for s in steps if s not in EPOCH_ENDS
    ]  # an epoch's last window is one micro-batch: nothing inside
    saves = list(range(SAVE_EVERY, MAX_STEPS + 1, SAVE_EVERY))
    logs = [s for s in steps if s % LOG_EVERY == 0] + [MAX_STEPS]
    draw = [
        ("setup", [0], 1),
        ("micro_batch", windows, 2),
        ("before_update", steps, 2),
        ("step_end", steps, 3),
        ("row", logs, 2),
        ("in_save", saves, 2),
        ("in_last_save", saves, 1),
        ("after_topk_save", saves, 1),
        ("after_save", saves, 2),
        ("epoch_start", [1, 2], 1),
        ("validation", [*EPOCH_ENDS, MAX_STEPS], 1),
        ("export_weights", [0], 1),
        ("export_tokenizer", [0], 1),
        ("train_end", [0], 1),
        ("final_metrics", [0], 1),
    ]
    cases = []
    for point, choices, n in draw:
        for step in sorted(rng.sample(choices, min(n, len(choices)))):
            cases.append((point, step, "SIGKILL"))
    for sig, point in (("SIGTERM", "step_end"), ("SIGTERM", "micro_batch"), ("SIGINT", "step_end")):
        cases.append(
            (point, rng.choice([s for s in (windows if point == "micro_batch" else steps)[1:-1]]), sig)
        )
    return cases


CASES = kill_points()


def case_id(case: tuple[str, int, str]) -> str:
    point, step, sig = case
    return f"{sig}-{point}-{step}"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = random.Random(0)
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
    ]
    path = tmp_path_factory.mktemp("data") / "lines.jsonl"
    with open(path, "w") as fh:
        for _ in range(40):  # 36 train rows, 4 validation rows
            fh.write(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(3, 30)))}) + "\n")
    return path


def cli(run_dir: Path, data: Path, *overrides: str):
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
        "data.per_device_train_batch_size=4",
        "data.per_device_eval_batch_size=4",
        "data.max_length=32",
        "data.validation_split=0.1",
        "trainer.enable_progress_bar=false",
        *SMALL_MODEL,
        *overrides,
        env=ONE_THREAD,
    )


# the cases run two processes at a time: one torch thread each keeps them from crowding the cores (the
# straight run and every stopped or resumed run alike)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
WALL_CLOCK = ("_per_s", "/mfu")


def rows(run_dir: Path) -> list[dict[str, str]]:
    """``metrics.csv`` rows in file order, without the wall-clock columns and the empty cells."""
    with open(run_dir / "metrics.csv", newline="") as fh:
        return [
            {k: v for k, v in r.items() if v not in ("", None) and not k.endswith(WALL_CLOCK)}
            for r in csv.DictReader(fh)
        ]


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files anywhere in the run folder."""
    return sorted(
        os.path.relpath(os.path.join(root, name), run_dir)
        for root, dirs, files in os.walk(run_dir)
        for name in files + dirs
        if ".tmp" in name
    )


def final_metrics(run_dir: Path) -> dict[str, float]:
    with open(run_dir / "final_metrics.json") as fh:
        values = json.load(fh)
    return {k: v for k, v in values.items() if not k.endswith(WALL_CLOCK) and k != "wall_time_s"}


def differences(straight: Path, resumed: Path) -> list[str]:
    """Everything in which ``resumed`` differs from ``straight`` (empty: the same run)."""
    from safetensors.torch import load_file

    found = []
    if not (resumed / "hf_model" / "model.safetensors").is_file():
        return [
            "no hf_model/model.safetensors (hf_model/: "
            f"{sorted(os.listdir(resumed / 'hf_model')) if (resumed / 'hf_model').is_dir() else 'absent'})"
        ]
    a, b = (
        load_file(straight / "hf_model" / "model.safetensors"),
        load_file(resumed / "hf_model" / "model.safetensors"),
    )
    bad = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
    if bad or a.keys() != b.keys():
        found.append(f"weights differ: {bad[:3]}")
    if sorted(os.listdir(straight / "hf_model")) != sorted(os.listdir(resumed / "hf_model")):
        found.append(f"hf_model files {sorted(os.listdir(resumed / 'hf_model'))}")
    ra, rb = rows(straight), rows(resumed)
    if ra != rb:
        extra = [r for r in rb if r not in ra]
        missing = [r for r in ra if r not in rb]
        found.append(
            f"metrics.csv rows differ: {len(rb)} rows vs {len(ra)}; extra {extra[:3]}; missing {missing[:3]}"
        )
    if not (resumed / "final_metrics.json").is_file():
        found.append("no final_metrics.json")
    elif final_metrics(straight) != final_metrics(resumed):
        fa, fb = final_metrics(straight), final_metrics(resumed)
        found.append(
            "final_metrics.json differs: "
            f"{ {k: (fa.get(k), fb.get(k)) for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} }"
        )
    ca, cb = sorted(os.listdir(straight / "checkpoints")), sorted(os.listdir(resumed / "checkpoints"))
    if ca != cb:
        found.append(f"checkpoints/ holds {cb}, the straight run {ca}")
    if leftovers(resumed):
        found.append(f"temporary files left: {leftovers(resumed)}")
    return found


EXPECTED_EXIT = {"SIGKILL": -signal.SIGKILL, "SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}


def stop_and_resume(run_dir: Path, data: Path, case: tuple[str, int, str]) -> dict[str, object]:
    point, step, sig = case
    stopped = cli(
        run_dir,
        data,
        "+callbacks.kill._target_=tests.kill_points.KillAt",
        f"+callbacks.kill.point={point}",
        f"+callbacks.kill.step={step}",
        f"+callbacks.kill.signal={sig}",
    )
    outcome: dict[str, object] = {"stopped": stopped.returncode, "stopped_err": stopped.stderr[-2000:]}
    if stopped.returncode != EXPECTED_EXIT[sig]:
        return outcome
    resumed = cli(run_dir, data, "ckpt_path=last")
    outcome.update(
        resumed=resumed.returncode, resumed_err=resumed.stderr[-3000:], resumed_out=resumed.stdout[-3000:]
    )
    return outcome


@pytest.fixture(scope="module")
def straight(text_file, tmp_path_factory):
    """The run that never stopped."""
    run = tmp_path_factory.mktemp("straight") / "run"
    proc = cli(run, text_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def runs(text_file, straight, tmp_path_factory):
    """Every case, two processes at a time: the straight folder, the cases' root, ``{case: outcome}``."""
    root = tmp_path_factory.mktemp("kills")
    with ThreadPoolExecutor(max_workers=int(os.environ.get("KILL_HARNESS_WORKERS", "2"))) as pool:
        futures = {
            case: pool.submit(stop_and_resume, root / case_id(case), text_file, case) for case in CASES
        }
        outcomes = {case: f.result() for case, f in futures.items()}
    return straight, root, outcomes


def test_the_draw_covers_every_kind_of_point():
    from tests.kill_points import POINTS

    kinds = {point for point, _, sig in CASES if sig == "SIGKILL"}
    assert kinds == set(POINTS) - set()  # every point is drawn at least once
    assert sum(sig == "SIGKILL" for _, _, sig in CASES) >= 20
    assert {sig for _, _, sig in CASES} == {"SIGKILL", "SIGTERM", "SIGINT"}


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_stopped_and_resumed_equals_straight(case, runs):
    straight, root, outcomes = runs
    outcome = outcomes[case]
    assert outcome["stopped"] == EXPECTED_EXIT[case[2]], (
        f"the stop did not happen as planned: {outcome['stopped_err']}"
    )
    assert outcome["resumed"] == 0, outcome["resumed_err"]
    assert differences(straight, root / case_id(case)) == []


# ------------------------------------------------------------------------------------------ bit rot, dirpath
ROT_AT = (0.05, 0.3, 0.5, 0.75, 0.97)  # fractions of last.ckpt: zip headers, pickle, weights


def test_bit_rot_in_last_ckpt_is_refused_then_the_named_checkpoint_resumes(straight, text_file, tmp_path):
    """64 bytes flipped in ``last.ckpt`` at five offsets (before: resumed silently, with the final weights
    off): each start with ``ckpt_path=last`` is refused in one line naming the file and the newest intact
    checkpoint; the command line it names finishes the run as the straight run did."""
    from tests.errors.support import one_line_error
    from tests.errors.test_checkpoint_integrity import DAMAGED, flip

    refused = []
    for fraction in ROT_AT:
        run = tmp_path / f"rot{fraction}"
        shutil.copytree(straight, run)
        flip(run / "checkpoints" / "last.ckpt", fraction)
        line = one_line_error(cli(run, text_file, "ckpt_path=last"))
        named = run / "checkpoints" / "step000012.ckpt"
        assert line == (
            f"hf_lightning: error: ckpt_path=last: cannot resume: {run / 'checkpoints' / 'last.ckpt'} "
            f"{DAMAGED}; the newest intact checkpoint there is {named} (step 12): resume from it with "
            f"ckpt_path={named}"
        )
        refused.append(fraction)
    assert refused == list(ROT_AT)  # 5/5
    run = tmp_path / f"rot{ROT_AT[0]}"
    proc = cli(run, text_file, f"ckpt_path={run / 'checkpoints' / 'step000012.ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert differences(straight, run) == []


def test_ckpt_path_last_finds_the_configured_checkpoint_folder(straight, text_file, tmp_path):
    """``callbacks.model_checkpoint.dirpath`` elsewhere: killed after step 7, ``ckpt_path=last`` resumes from
    that folder (before: "no checkpoint at RUN/checkpoints/last.ckpt")."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    where = f"callbacks.model_checkpoint.dirpath={elsewhere}"
    stopped = cli(
        run,
        text_file,
        where,
        "+callbacks.kill._target_=tests.kill_points.KillAt",
        "+callbacks.kill.point=step_end",
        "+callbacks.kill.step=7",
    )
    assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-3000:]
    proc = cli(run, text_file, where, "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(elsewhere, run / "checkpoints")  # compared as if they were in the run folder
    assert differences(straight, run) == []


def test_a_last_ckpt_that_is_a_directory_is_refused_then_the_named_checkpoint_resumes(
    straight, text_file, tmp_path
):
    """``checkpoints/last.ckpt`` is a directory (before: a Hydra traceback, exit 1): one line naming it and
    the newest intact checkpoint, nothing in the folder touched; once the directory is moved away, the
    command line it names finishes the run as the straight run did."""
    from tests.errors.support import one_line_error

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    folder = run / "checkpoints"
    (folder / "last.ckpt").unlink()
    (folder / "last.ckpt.sha256").unlink()
    (folder / "last.ckpt").mkdir()
    before = sorted(os.listdir(folder))
    named, last = folder / "step000012.ckpt", folder / "last.ckpt"
    assert one_line_error(cli(run, text_file, "ckpt_path=last")) == (
        f"hf_lightning: error: ckpt_path=last: cannot resume: {last} is a directory, not a checkpoint file; "
        f"the newest intact checkpoint there is {named} (step 12): move {last} out of the way (this run "
        "saves its last checkpoint under that name) and resume from it with "
        f"ckpt_path={named}"
    )
    assert sorted(os.listdir(folder)) == before
    os.rename(folder / "last.ckpt", tmp_path / "moved-away")
    proc = cli(run, text_file, f"ckpt_path={named}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert differences(straight, run) == []
