"""Nothing hf_lightning reads can run code: a pickle whose ``__reduce__`` creates a file, planted at every
entry point that reads a checkpoint, a ``meta.pt``, a DCP index or entry, DeepSpeed states or a
``training_args.bin``, never runs; the file is refused in one line naming the pickled type, before any of it
is unpickled. A checksum is no defence (the planted ``last.ckpt`` comes with a rewritten ``.sha256``, the
sharded folders with a regenerated manifest), and a file without one is refused the same way.

A shard of another save swapped into a sharded folder, or a missing one, with the manifest regenerated over
it, is refused by the load itself naming the shard: never mixed weights.

The marker file is the oracle: ``torch.load(weights_only=False)`` (the code before) creates it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from hf_lightning import ConfigError
from hf_lightning.checkpointing.io import AtomicCheckpointIO, file_sha256
from hf_lightning.checkpointing.resume import checkpoint_problem, resolve_ckpt_path
from hf_lightning.checkpointing.sharded import (
    load_sharded_weights,
    load_shards,
    stamp_shards,
    write_manifest,
    write_shards,
)
from hf_lightning.core.errors import UnsafeCheckpointError

TYPE = "builtins.getattr"  # pathlib.Path.touch pickles as getattr(PosixPath, "touch")
REFUSED = (
    f"holds a pickled {TYPE}, a type no hf_lightning checkpoint holds: refused unread, since unpickling it "
    "could run code (load only checkpoints you trust)"
)


class Payload:
    """Unpickling it creates ``marker`` (what an attacker's ``os.system`` would do, without a shell)."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload-ran"
    yield path
    assert not path.exists(), "the planted payload ran"


def lightning_checkpoint(step: int = 3, **extra) -> dict:
    """The keys a resumable Lightning checkpoint holds (a one-layer model)."""
    layer = torch.nn.Linear(2, 2)
    return {
        "global_step": step,
        "state_dict": {f"model.{k}": v for k, v in layer.state_dict().items()},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}],
        "lr_schedulers": [{"last_epoch": step}],
        "loops": {"fit_loop": {}},
        **extra,
    }


def plant(path: pathlib.Path, marker: pathlib.Path, sidecar: bool = True) -> pathlib.Path:
    """A checkpoint file at ``path`` carrying the payload, with a matching ``.sha256`` when ``sidecar``."""
    torch.save(lightning_checkpoint(payload=Payload(marker)), path)
    if sidecar:
        (path.parent / f"{path.name}.sha256").write_text(f"{file_sha256(str(path))}  {path.name}\n")
    return path


def test_the_payload_runs_under_an_unrestricted_load(tmp_path):
    """The oracle works: the code before (``weights_only=False``) created the marker."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "x.ckpt", marker), weights_only=False)
    assert marker.exists()


def test_a_replaced_last_ckpt_with_a_rewritten_sha256_is_refused_naming_the_type(tmp_path, marker):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(lightning_checkpoint(step=2), folder / "step2.ckpt")
    plant(folder / "last.ckpt", marker)
    assert checkpoint_problem(str(folder / "last.ckpt")) == (REFUSED, None)
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path("last", str(tmp_path / "run"))
    step2 = folder / "step2.ckpt"
    assert str(err.value) == (
        f"ckpt_path=last: cannot resume: {folder / 'last.ckpt'} {REFUSED}; the newest intact checkpoint "
        f"there is {step2} (step 2): resume from it with ckpt_path={step2}"
    )


def test_every_candidate_of_ckpt_path_last_is_opened_safely(tmp_path, marker):
    """Without a ``last.ckpt`` each checkpoint of the folder is opened, newest first: none runs its
    payload, and the refusal names them."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    plant(folder / "step1.ckpt", marker, sidecar=False)
    with pytest.raises(ConfigError, match=f"step1.ckpt holds a pickled {TYPE}"):
        resolve_ckpt_path("last", str(tmp_path / "run"), purpose="evaluate")


@pytest.mark.parametrize("purpose", ["train", "evaluate"])
def test_a_file_without_a_sha256_given_as_ckpt_path_is_refused(tmp_path, marker, purpose):
    path = plant(tmp_path / "x.ckpt", marker, sidecar=False)
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path(str(path), str(tmp_path), purpose=purpose)
    verb = "resume" if purpose == "train" else "evaluate"
    assert str(err.value).startswith(f"ckpt_path={path}: cannot {verb}: {path} {REFUSED}; ")


def test_lightning_s_own_load_goes_through_the_safe_loader(tmp_path, marker):
    """``trainer.fit(ckpt_path=...)`` reads the file through ``AtomicCheckpointIO``, whatever
    ``weights_only`` Lightning passes."""
    path = plant(tmp_path / "x.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError) as err:
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert str(err.value) == f"{path} {REFUSED}"
    intact = tmp_path / "ok.ckpt"
    torch.save(lightning_checkpoint(step=4), intact)
    assert AtomicCheckpointIO().load_checkpoint(intact)["global_step"] == 4


def test_trainer_fit_with_a_planted_ckpt_path_refuses_it(tmp_path, marker, word_tokenizer):
    """A real ``Trainer`` with our checkpoint IO: ``fit(ckpt_path=planted)`` stops at the load."""
    from tests.errors.support import run

    t, module, dm = run(tmp_path, word_tokenizer, [], max_steps=1, plugins=[AtomicCheckpointIO()])
    path = plant(tmp_path / "x.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError, match=f"holds a pickled {TYPE}"):
        t.fit(module, datamodule=dm, ckpt_path=str(path))


@pytest.mark.slow  # two real fits
def test_a_real_checkpoint_still_resumes_through_lightning_s_load(tmp_path, word_tokenizer):
    """The allow-list is complete for what a real fit writes: the checkpoint of step 2 resumes through
    ``AtomicCheckpointIO`` to step 3."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.errors.support import run

    folder = tmp_path / "checkpoints"
    saving = ModelCheckpoint(dirpath=folder, save_last=True, every_n_train_steps=1)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [saving],
        max_steps=2,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    t.fit(module, datamodule=dm)
    saved = torch.load(folder / "last.ckpt", weights_only=False)  # our own file: the oracle
    t2, module2, dm2 = run(tmp_path, word_tokenizer, [], max_steps=3, plugins=[AtomicCheckpointIO()])
    t2.fit(module2, datamodule=dm2, ckpt_path=str(folder / "last.ckpt"))
    assert (saved["global_step"], t2.global_step) == (2, 3)


def test_the_weights_route_refuses_a_planted_file(tmp_path, marker):
    """``evaluate``, ``resume_weights_only`` and the best-model reload read weights with
    ``load_model_weights``."""
    from hf_lightning.checkpointing.weights import load_model_weights

    path = plant(tmp_path / "x.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError, match=f"holds a pickled {TYPE}"):
        load_model_weights(torch.nn.Linear(2, 2), str(path), None)


def dcp_folder(path: pathlib.Path, seed: int = 0, step: int = 7, token: int = 11, optimizer=None) -> None:
    """A sharded checkpoint folder as ``AtomicShardedCheckpoints`` writes it (one rank): DCP shards with the
    save's stamp, ``meta.pt``, the manifest."""
    torch.manual_seed(seed)
    layer = torch.nn.Linear(4, 3)
    path.mkdir(parents=True)
    state = {"state_dict": {f"model.{k}": v for k, v in layer.state_dict().items()}}
    state["optimizer_0"] = optimizer if optimizer is not None else {"lr": 0.1}
    meta = {"global_step": step, "loops": {"fit_loop": {}}, "lr_schedulers": [{}], "epoch": 0}
    stamp_shards(state, meta, token, 0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # DCP: "assuming the intent is to save in a single process"
        write_shards(state, str(path))
    torch.save(meta, path / "meta.pt")
    write_manifest(str(path))


def test_a_sharded_folder_s_meta_pt_with_a_regenerated_manifest_is_refused(tmp_path, marker):
    folder = tmp_path / "last.ckpt"
    dcp_folder(folder)
    assert checkpoint_problem(str(folder)) == (None, 7)
    meta = torch.load(folder / "meta.pt", weights_only=True)
    torch.save({**meta, "payload": Payload(marker)}, folder / "meta.pt")
    write_manifest(str(folder))
    assert checkpoint_problem(str(folder)) == (f"is refused: meta.pt {REFUSED}", None)


def test_a_dcp_index_naming_another_type_is_refused_before_dcp_unpickles_it(tmp_path, marker):
    """DCP reads ``.metadata`` with plain ``pickle.load``: it is scanned first."""
    import pickle

    folder = tmp_path / "last.ckpt"
    dcp_folder(folder)
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(str(folder))
    # plain pickle names the function itself
    refused = REFUSED.replace(TYPE, "pathlib.Path.touch")
    assert checkpoint_problem(str(folder)) == (f"is refused: .metadata {refused}", None)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata holds a pickled pathlib.Path.touch"):
        load_sharded_weights(torch.nn.Linear(4, 3), str(folder))


def test_a_planted_entry_inside_a_shard_is_refused_by_the_load(tmp_path, marker):
    """DCP loads a non-tensor entry (stored as ``torch.save`` bytes in the shard) with
    ``weights_only=False``; our planner loads it through the safe loader."""
    folder = tmp_path / "last.ckpt"
    dcp_folder(folder, optimizer={"lr": Payload(marker)})
    with pytest.raises(UnsafeCheckpointError, match=f"a stored entry holds a pickled {TYPE}"):
        load_shards({"optimizer_0": {"lr": 0.0}}, str(folder))


def test_a_foreign_shard_under_a_regenerated_manifest_is_refused_naming_it(tmp_path):
    """Two saves of the same shapes (another run, same step): the shard of one swapped into the other and
    the manifest regenerated pass the manifest; the stamps inside the shards do not."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    dcp_folder(mine, seed=0, token=11)
    dcp_folder(theirs, seed=1, token=22)
    shutil.copyfile(theirs / "__0_0.distcp", mine / "__0_0.distcp")
    write_manifest(str(mine))
    problem = (
        "is refused: its shard __0_0.distcp belongs to another checkpoint (its stamp: rank 0 of 1, step 7, "
        "another save; meta.pt: rank 0 of 1, step 7), so loading it would mix weights; resume from another "
        "checkpoint"
    )
    assert checkpoint_problem(str(mine)) == (problem, 7)
    from hf_lightning.checkpointing.weights import load_model_weights

    model = torch.nn.Module()
    model.model = torch.nn.Linear(4, 3)
    before = model.model.weight.detach().clone()
    with pytest.raises(ConfigError, match="__0_0.distcp belongs to another checkpoint"):
        load_model_weights(model, str(mine), None)
    assert torch.equal(model.model.weight, before)  # nothing of the foreign shard was loaded


def test_a_missing_shard_under_a_regenerated_manifest_is_refused_naming_it(tmp_path):
    folder = tmp_path / "last.ckpt"
    dcp_folder(folder)
    os.unlink(folder / "__0_0.distcp")
    write_manifest(str(folder))
    assert checkpoint_problem(str(folder)) == (
        "is damaged: its shard __0_0.distcp is missing (its index .metadata names it)",
        7,
    )


def test_deepspeed_states_are_scanned_before_deepspeed_unpickles_them(tmp_path, marker):
    """DeepSpeed's engine and ``zero_to_fp32`` read their states with ``weights_only=False``: each ``*.pt``
    of the folder is scanned first (the folder's layout as ``DeepSpeedEngine.save_checkpoint`` writes it)."""
    from hf_lightning.checkpointing.sharded import check_deepspeed_states

    folder = tmp_path / "last.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint")
    torch.save(lightning_checkpoint(module={}), folder / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.save(
        {"payload": Payload(marker)}, folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    write_manifest(str(folder))
    assert checkpoint_problem(str(folder)) == (
        f"is refused: checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt {REFUSED}",
        None,
    )
    with pytest.raises(UnsafeCheckpointError, match="optim_states.pt holds a pickled builtins.getattr"):
        check_deepspeed_states(str(folder))


def test_a_planted_training_args_bin_is_refused_by_migrate(tmp_path, marker):
    """``python -m hf_lightning.migrate training_args.bin``: a pickle naming another type is refused."""
    from hf_lightning.migrate.__main__ import load_arguments

    path = tmp_path / "training_args.bin"
    torch.save({"learning_rate": Payload(marker)}, path)
    with pytest.raises(ConfigError, match=f"holds {TYPE}, which migrate does not unpickle"):
        load_arguments(str(path))


def run_module(module: str, *overrides: str) -> subprocess.CompletedProcess:
    """``python -m MODULE`` as a user runs it (the worktree's package first on the path)."""
    repo = str(pathlib.Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.run(
        [sys.executable, "-m", module, *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=repo,
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_the_cli_refuses_a_planted_ckpt_path_in_one_line(tmp_path, marker, command):
    """``python -m hf_lightning.train|evaluate ckpt_path=X.ckpt`` (no sidecar): exit 2, one line naming the
    type, the payload never ran."""
    from tests.errors.support import one_line_error

    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "a b c d"}\n' * 8)
    path = plant(tmp_path / "x.ckpt", marker, sidecar=False)
    proc = run_module(
        f"hf_lightning.{command}",
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"ckpt_path={path}",
    )
    line = one_line_error(proc)
    verb = "resume" if command == "train" else "evaluate"
    assert line.startswith(f"hf_lightning: error: ckpt_path={path}: cannot {verb}: {path} {REFUSED}"), line
