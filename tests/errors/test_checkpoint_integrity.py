"""Every checkpoint carries its SHA-256; a file whose bytes changed after it was written (bit rot, an
incomplete copy) is refused on load, naming it and the newest intact checkpoint, which then resumes.
``ckpt_path=last`` without a ``last.ckpt`` (a kill before the first one) resumes from the newest intact
checkpoint, saying so.

The checkpoints are real ones, written by a real ``Trainer`` fit through :class:`AtomicCheckpointIO`; the
checksum is checked against ``hashlib`` and against coreutils' ``sha256sum -c``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from hf_lightning import ConfigError
from hf_lightning.checkpointing import AtomicCheckpointIO, find_resume_checkpoint
from hf_lightning.checkpointing.io import checksum_problem

DAMAGED = (
    "is damaged: its SHA-256 does not match the one written with it (last.ckpt.sha256), so its bytes changed "
    "after it was saved (a failing disk or an incomplete copy)"
)


@pytest.fixture(scope="module")
def written(tmp_path_factory, word_tokenizer):
    """A run folder with the checkpoints of steps 1-3 and last.ckpt (step 3), each written in turn."""
    from tests.errors.support import ROWS, run

    tmp = tmp_path_factory.mktemp("written")
    folder = tmp / "run" / "checkpoints"
    ckpt = ModelCheckpoint(
        dirpath=folder,
        filename="step{step}",
        every_n_train_steps=1,
        save_last=True,
        save_top_k=-1,
        auto_insert_metric_name=False,
    )
    t, module, dm = run(
        tmp,
        word_tokenizer,
        [ckpt],
        max_steps=3,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    t.fit(module, datamodule=dm)
    return tmp / "run"


@pytest.fixture
def run_dir(written, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(written, copy)
    return copy


def flip(path, fraction: float, n: int = 64) -> None:
    """Invert ``n`` bytes at ``fraction`` of the file (bit rot)."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * fraction)
    data[start : start + n] = bytes(b ^ 0xFF for b in data[start : start + n])
    path.write_bytes(bytes(data))


def test_each_checkpoint_has_its_sha256_in_sha256sum_format(run_dir):
    folder = run_dir / "checkpoints"
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    assert names == ["last.ckpt", "step1.ckpt", "step2.ckpt", "step3.ckpt"]
    for name in names:
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert (folder / f"{name}.sha256").read_text() == f"{digest}  {name}\n"
        check = subprocess.run(
            ["sha256sum", "-c", f"{name}.sha256"], cwd=folder, capture_output=True, text=True
        )
        assert check.returncode == 0 and check.stdout == f"{name}: OK\n"


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.75, 0.97])
def test_bit_rot_is_refused_naming_the_file_and_the_newest_intact_one(run_dir, fraction):
    """64 bytes flipped at five places of last.ckpt: in the zip headers, in the pickle, in the weights.
    Before, a flip inside a tensor resumed silently (the resume check read the file with mmap and never
    touched it)."""
    folder = run_dir / "checkpoints"
    flip(folder / "last.ckpt", fraction)
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint("last", str(run_dir))
    step3 = folder / "step3.ckpt"
    assert str(err.value) == (
        f"ckpt_path=last: cannot resume: {folder / 'last.ckpt'} {DAMAGED}; the newest intact checkpoint "
        f"there is {step3} (step 3): resume from it with ckpt_path={step3}"
    )
    assert find_resume_checkpoint(str(step3), str(run_dir)) == str(
        step3
    )  # the named one resumes: no ping-pong
    with pytest.raises(
        ConfigError, match="is damaged: its SHA-256 does not match"
    ):  # Lightning's own load too
        AtomicCheckpointIO().load_checkpoint(folder / "last.ckpt")


def test_a_kill_between_the_rename_and_the_sidecar_leaves_a_pair_that_verifies(run_dir):
    """While a checkpoint is replaced, its sidecar lists the old and the new hash: either file verifies."""
    folder = run_dir / "checkpoints"
    old, new = folder / "step2.ckpt", folder / "step3.ckpt"
    both = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (old, new)]
    (folder / "last.ckpt.sha256").write_text("".join(f"{h}  last.ckpt\n" for h in both))
    for source in (old, new):
        shutil.copyfile(source, folder / "last.ckpt")
        assert checksum_problem(str(folder / "last.ckpt")) is None
    flip(folder / "last.ckpt", 0.5)
    assert checksum_problem(str(folder / "last.ckpt")).startswith("is damaged")


def test_without_last_ckpt_the_newest_intact_checkpoint_resumes(run_dir, capsys):
    """A kill after the periodic checkpoint of a step and before the first last.ckpt: before, ckpt_path=last
    said "drop ckpt_path to start fresh", which the folder then refused (it holds a run)."""
    folder = run_dir / "checkpoints"
    (folder / "last.ckpt").unlink()
    (folder / "last.ckpt.sha256").unlink()
    flip(folder / "step3.ckpt", 0.5)  # the newest is damaged too: the next one is named
    assert find_resume_checkpoint("last", str(run_dir)) == str(folder / "step2.ckpt")
    assert capsys.readouterr().err == (
        f"hf_lightning: note: ckpt_path=last: there is no {folder / 'last.ckpt'} (the run stopped before "
        f"writing it): resuming from the newest intact checkpoint, {folder / 'step2.ckpt'} (step 2)\n"
    )


def test_garbage_is_explained_as_damage_not_with_torchs_advice(run_dir):
    """A checkpoint without a sidecar (copied from elsewhere) that is not a readable file: "damaged", in one
    line, without torch's paragraphs about mmap and zip files."""
    folder = run_dir / "checkpoints"
    (folder / "step3.ckpt.sha256").unlink()
    (folder / "step3.ckpt").write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint(str(folder / "step3.ckpt"), str(run_dir))
    message = str(err.value)
    assert message.startswith(
        f"ckpt_path={folder / 'step3.ckpt'}: cannot resume: {folder / 'step3.ckpt'} is damaged: "
        "not a readable checkpoint ("
    )
    assert message.endswith(
        f"the newest intact checkpoint there is {folder / 'last.ckpt'} (step 3): resume from it "
        f"with ckpt_path={folder / 'last.ckpt'}"
    )
    assert "\n" not in message and "mmap" not in message and "zipfile" not in message


def test_rotation_removes_the_sidecar_with_its_checkpoint(tmp_path, word_tokenizer):
    from tests.errors.support import ROWS, run

    folder = tmp_path / "run" / "checkpoints"
    ckpt = ModelCheckpoint(
        dirpath=folder,
        every_n_train_steps=1,
        save_last=True,
        save_top_k=1,
        monitor="step",
        mode="max",
        filename="step{step}",
        auto_insert_metric_name=False,
    )
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [ckpt],
        max_steps=3,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    t.fit(module, datamodule=dm)
    assert sorted(p.name for p in folder.iterdir()) == [
        "last.ckpt",
        "last.ckpt.sha256",
        "step3.ckpt",
        "step3.ckpt.sha256",
    ]
    assert torch.load(folder / "step3.ckpt", weights_only=False)["global_step"] == 3


def _directory(path):
    path.mkdir()
    (path / "model_states.pt").write_bytes(b"\0" * 16)


def _dangling_link(path):
    path.symlink_to(path.parent / "gone.ckpt")


def _link_to_a_directory(path):
    (path.parent / "elsewhere").mkdir()
    path.symlink_to(path.parent / "elsewhere")


def _link_loop(path):
    path.symlink_to(path)  # cannot be opened: the OS says why (ELOOP)


def _empty(path):
    path.write_bytes(b"")


def _truncated(path, data):
    path.write_bytes(data[: len(data) // 2])


LAST_ACCIDENTS = {
    # name: (make it, why it cannot be resumed from, as the refusal says)
    "directory": (_directory, "is a directory, not a checkpoint file"),
    "dangling link": (_dangling_link, "is a symbolic link to {folder}/gone.ckpt, which does not exist"),
    "link to a directory": (
        _link_to_a_directory,
        "is a directory (a symbolic link to one), not a checkpoint file",
    ),
    "link loop": (_link_loop, "is a symbolic link loop (it links back to itself through {folder}/last.ckpt)"),
    "empty": (_empty, "is damaged: it is empty (0 bytes), not a checkpoint"),
}


@pytest.mark.parametrize("accident", list(LAST_ACCIDENTS))
def test_a_last_ckpt_that_is_not_a_checkpoint_file_names_the_newest_intact_one(run_dir, accident):
    """``last.ckpt`` replaced by a directory, a dangling link, a link to a directory, a link loop, an empty
    file (no sidecar: copied from elsewhere). Before: a traceback from Hydra (``IsADirectoryError``,
    ``FileNotFoundError`` while sorting the folder), exit 1. Now one line naming the file and the newest
    intact checkpoint; nothing in the folder is touched, and the named checkpoint resumes."""
    folder = run_dir / "checkpoints"
    last, step3 = folder / "last.ckpt", folder / "step3.ckpt"
    last.unlink()
    (folder / "last.ckpt.sha256").unlink()
    make, why = LAST_ACCIDENTS[accident]
    make(last)
    before = sorted(os.listdir(folder))
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint("last", str(run_dir))
    blocks = os.path.isdir(last)  # a directory of that name would refuse the resumed run's first save
    fix = (
        f"move {last} out of the way (this run saves its last checkpoint under that name) and resume from it "
        f"with ckpt_path={step3}"
        if blocks
        else f"resume from it with ckpt_path={step3}"
    )
    assert str(err.value) == (
        f"ckpt_path=last: cannot resume: {last} {why.format(folder=folder)}; the newest intact checkpoint "
        f"there is {step3} (step 3): {fix}"
    )
    assert sorted(os.listdir(folder)) == before
    if blocks:
        with pytest.raises(ConfigError) as err:
            find_resume_checkpoint(str(step3), str(run_dir))
        assert str(err.value) == (
            f"ckpt_path={step3}: {last} is a directory, and this run saves its last checkpoint under that "
            "name (the save would fail after training): move it out of the way, then run the command again"
        )
        os.rename(last, run_dir / "moved-away")
    assert find_resume_checkpoint(str(step3), str(run_dir)) == str(step3)


def test_a_truncated_last_ckpt_is_damaged(run_dir):
    """Half of a real checkpoint's bytes, with no sidecar to compare with: torch's reader fails, said in one
    line."""
    folder = run_dir / "checkpoints"
    last = folder / "last.ckpt"
    (folder / "last.ckpt.sha256").unlink()
    _truncated(last, last.read_bytes())
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint("last", str(run_dir))
    message = str(err.value)
    assert message.startswith(
        f"ckpt_path=last: cannot resume: {last} is damaged: not a readable checkpoint (RuntimeError: "
    )
    assert message.endswith(
        f"the newest intact checkpoint there is {folder / 'step3.ckpt'} (step 3): resume from it with "
        f"ckpt_path={folder / 'step3.ckpt'}"
    )
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions")
def test_an_unreadable_last_ckpt_says_why(run_dir):
    folder = run_dir / "checkpoints"
    last = folder / "last.ckpt"
    last.chmod(0)
    try:
        with pytest.raises(ConfigError, match=r"last.ckpt cannot be read \(Permission denied\)"):
            find_resume_checkpoint("last", str(run_dir))
    finally:
        last.chmod(0o644)


@pytest.mark.parametrize("kind", ["the checkpoint folder", "a dangling link"])
def test_an_explicit_ckpt_path_that_is_not_a_file_names_what_it_is(run_dir, kind):
    """``ckpt_path=RUN/checkpoints`` (a folder: its newest intact checkpoint is named) and a dangling link
    (before: "no such file; check the path" for both)."""
    folder = run_dir / "checkpoints"
    if kind == "a dangling link":
        path = folder / "link.ckpt"
        path.symlink_to(run_dir / "gone.ckpt")
        why, where = f"is a symbolic link to {run_dir / 'gone.ckpt'}, which does not exist", "there"
    else:
        path, why, where = folder, "is a directory, not a checkpoint file", "in it"
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint(str(path), str(run_dir))
    last = folder / "last.ckpt"
    assert str(err.value) == (
        f"ckpt_path={path}: cannot resume: {path} {why}; the newest intact checkpoint {where} is {last} "
        f"(step 3): resume from it with ckpt_path={last}"
    )


def test_a_folder_that_is_a_link_loop_is_said_to_be_one(run_dir):
    """A checkpoint behind a folder that links back to itself: the OS reaches nothing through it (ELOOP).
    Before: ``no such file; check the path``."""
    loop = run_dir / "loop"
    loop.symlink_to(loop)
    path = loop / "last.ckpt"
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint(str(path), str(run_dir))
    assert str(err.value) == (
        f"ckpt_path={path}: {path} cannot be reached: a folder on its path is a symbolic link loop (it links "
        "back to itself); fix the link, or give the checkpoint's real path"
    )
    with pytest.raises(ConfigError, match="a folder on its path is a symbolic link loop"):
        find_resume_checkpoint("last", str(run_dir), checkpoint_dir=str(loop))


def test_ckpt_path_best_is_the_best_checkpoint_or_one_line(run_dir):
    """``ckpt_path=best`` is a keyword as ``last`` is: ``checkpoints/best.ckpt``, which a run with
    ``metric_for_best_model`` keeps; a run without one is told so in one line (before: ``ckpt_path=best: no
    such file``)."""
    from hf_lightning.checkpointing.resume import resolve_ckpt_path

    folder = run_dir / "checkpoints"
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path("best", str(run_dir), purpose="evaluate")
    assert str(err.value) == (
        f"ckpt_path=best: the run in {run_dir} kept no best checkpoint (there is no "
        f"{folder / 'best.ckpt'}; it is kept when the run sets metric_for_best_model and a validation ran); "
        "use ckpt_path=last or a checkpoint file"
    )
    shutil.copyfile(folder / "step2.ckpt", folder / "best.ckpt")
    assert resolve_ckpt_path("best", str(run_dir), purpose="evaluate") == str(folder / "best.ckpt")
    assert find_resume_checkpoint("best", str(run_dir)) == str(folder / "best.ckpt")


def test_max_steps_below_the_checkpoints_step_is_refused(run_dir):
    """``last.ckpt`` is at step 3: ``trainer.max_steps=2`` has nothing to train (refused, naming both
    steps); 3 (the run's end) and 4 are a resume."""
    from omegaconf import OmegaConf

    from hf_lightning.run.folder import check_steps_left

    def cfg(max_steps):
        return OmegaConf.create({"trainer": {"max_steps": max_steps}})

    last = str(run_dir / "checkpoints" / "last.ckpt")
    with pytest.raises(ConfigError) as err:
        check_steps_left(cfg(2), last)
    assert str(err.value) == (
        f"trainer.max_steps=2 is below optimizer step 3 of {last}, where this resume would start: there is "
        "nothing to train below the checkpoint's step. Give trainer.max_steps=4 or more to continue the run "
        "(the run folder is unchanged)"
    )
    for ok in (3, 4, -1, None):
        check_steps_left(cfg(ok), last)
