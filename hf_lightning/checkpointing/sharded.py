"""Checkpoints of a sharded run (FSDP2, DeepSpeed ZeRO): one folder, each rank writes its shard, with
today's promises.

Lightning's ``ModelParallelStrategy`` writes a checkpoint as a ``torch.distributed.checkpoint`` (DCP) folder:
``.metadata`` and one ``__R_0.distcp`` per rank (the model's and the optimizers' shards), and ``meta.pt``
(everything else: loops, schedulers, callbacks, the train log) from rank 0; it bypasses ``CheckpointIO``.
Lightning's ``DeepSpeedStrategy`` lets the engine write its own folder (``DeepSpeedEngine.save_checkpoint``:
``latest`` naming the tag folder ``checkpoint/``, which holds the model states with the rest of Lightning's
checkpoint and one ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` per rank; under ZeRO-3 the model states per
rank too). :class:`AtomicShardedCheckpoints` (a mixin in front of either strategy) gives that folder the
promises of :class:`~hf_lightning.checkpointing.io.AtomicCheckpointIO`:

- **atomic**: every rank writes into one temporary sibling folder (``.tmp-last.ckpt.XXXX``, named by rank 0);
  each rank's files are fsync'd (DCP's ``sync_files``); after a barrier, rank 0 writes ``meta.pt`` and the
  manifest, fsyncs them and renames the folder into place
  (:func:`~hf_lightning.checkpointing.files.atomic_folder`). A kill before the rename leaves the previous
  checkpoint as it was (the next start removes the temporary folder). A folder cannot be renamed over
  another: between the two renames of a replace (the old folder aside, the new one in), a kill leaves no
  ``last.ckpt`` and ``ckpt_path=last`` resumes from the newest intact periodic checkpoint.
- **checksummed**: :data:`MANIFEST` inside the folder lists the SHA-256 of every other file in
  ``sha256sum`` format (``cd last.ckpt && sha256sum -c manifest.sha256`` checks it by hand). A load and every
  resume check (:mod:`hf_lightning.checkpointing.resume`) verify it (:func:`folder_problem`).
- **reshardable** (DCP folders): DCP stores each tensor's global shape and every shard's offsets, so a
  folder written by N ranks loads into M ranks (the model and the optimizer state are resharded on load).
  The data position is the train loader's windows consumed, the same on every rank: it names the same rows
  of the one global order when the rows per optimizer step (ranks x ``per_device_train_batch_size`` x
  ``gradient_accumulation_steps``) are unchanged; :func:`resharding_problem` refuses a resume where they are
  not.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from hf_lightning.checkpointing.files import atomic_folder, fsync_folder
from hf_lightning.core.errors import UnsafeCheckpointError

MANIFEST = "manifest.sha256"
META = "meta.pt"  # Lightning's name for the non-tensor part (``lightning.fabric.strategies.fsdp``)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards
# DeepSpeed's name for the file naming the tag folder (``DeepSpeedEngine.save_checkpoint``)
DS_LATEST = "latest"
SHARD_STAMP = "hf_lightning_shard"  # each rank's stamp in DCP, and the expected one in meta.pt
_VERIFIED: dict[tuple, str | None] = {}  # (path, sizes and mtimes of its files) -> problem: hashed once


def is_sharded_checkpoint(path: Any) -> bool:
    """Whether ``path`` is a checkpoint folder of a sharded run: a folder holding DCP's ``.metadata``, a
    ``meta.pt``, DeepSpeed's ``latest`` or a :data:`MANIFEST` (one of them missing is damage, which
    :func:`sharded_checkpoint_problem` names)."""
    path = os.fspath(path)
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name)) for name in (DCP_METADATA, META, DS_LATEST, MANIFEST)
    )


def is_deepspeed_checkpoint(path: Any) -> bool:
    """Whether the checkpoint folder ``path`` was written by a DeepSpeed engine: its :data:`MANIFEST` (or,
    without one, its listing) names DeepSpeed's ``latest``."""
    path = os.fspath(path)
    manifest = os.path.join(path, MANIFEST)
    if os.path.isfile(manifest):
        with open(manifest) as fh:
            return any(line.split(None, 1)[-1].lstrip("*") == DS_LATEST for line in fh.read().splitlines())
    return os.path.isfile(os.path.join(path, DS_LATEST))


def is_sharded_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` keeps its model sharded as DTensors and saves DCP folders
    (Lightning's ``ModelParallelStrategy``, the base of ``strategy=fsdp``)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return isinstance(strategy, ModelParallelStrategy)


def _files(folder: str) -> list[str]:
    """Every file under ``folder`` but the manifest, as sorted paths relative to it."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def write_manifest(folder: str) -> None:
    """Write :data:`MANIFEST` into ``folder``: ``SHA256  relative/path`` per file, fsync'd."""
    from hf_lightning.checkpointing.io import file_sha256

    lines = "".join(f"{file_sha256(os.path.join(folder, rel))}  {rel}\n" for rel in _files(folder))
    with open(os.path.join(folder, MANIFEST), "w") as fh:
        fh.write(lines)
        fh.flush()
        os.fsync(fh.fileno())


def folder_problem(path: str, hash_files: bool = True) -> str | None:
    """Why the checkpoint folder ``path`` fails its manifest (``'is damaged: ...'``), or ``None`` when every
    file matches (a folder without a manifest, written elsewhere, has nothing to check against and passes).

    A file listed but absent, a file present but not listed, and (``hash_files``) a hash that differs are each
    damage. ``hash_files=False`` checks the listing only (no file is read).
    """
    manifest = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest):
        return None
    files = _files(path)
    key = (
        os.path.abspath(path),
        tuple(
            (f, os.stat(os.path.join(path, f)).st_size, os.stat(os.path.join(path, f)).st_mtime_ns)
            for f in files
        ),
        os.stat(manifest).st_mtime_ns,
    )
    if key in _VERIFIED:
        return _VERIFIED[key]
    from hf_lightning.checkpointing.io import file_sha256

    if not hash_files:
        key = (*key, "listing")
        if key in _VERIFIED:
            return _VERIFIED[key]

    with open(manifest) as fh:
        listed = {
            parts[1].lstrip("*"): parts[0].lower()
            for parts in (line.split(None, 1) for line in fh.read().splitlines())
            if len(parts) == 2
        }
    problem = None
    missing = sorted(set(listed) - set(files))
    extra = sorted(set(files) - set(listed))
    if missing:
        problem = f"is damaged: {missing[0]} is listed in its {MANIFEST} but missing (an incomplete copy)"
    elif extra:
        problem = f"is damaged: {extra[0]} is not listed in its {MANIFEST} (a file added after it was saved)"
    elif hash_files:
        bad = next((f for f in files if file_sha256(os.path.join(path, f)) != listed[f]), None)
        if bad is not None:
            problem = (
                f"is damaged: the SHA-256 of {bad} does not match the one written with it ({MANIFEST}), so "
                "its bytes changed after it was saved (a failing disk or an incomplete copy)"
            )
    _VERIFIED[key] = problem
    return problem


def read_meta(path: str) -> dict[str, Any]:
    """The non-tensor part of a sharded checkpoint (``meta.pt``: loops, schedulers, callbacks, ...).

    Raises:
        UnsafeCheckpointError: it names a pickled type outside the allow-list
            (:func:`~hf_lightning.checkpointing.safe_load.load_checkpoint_file`; nothing of it is unpickled).
        OSError, RuntimeError, pickle errors: as ``torch.load`` (the caller words them).
    """
    from hf_lightning.checkpointing.safe_load import load_checkpoint_file

    return load_checkpoint_file(os.path.join(path, META))


def shard_reader(path: str) -> Any:
    """A ``torch.distributed.checkpoint`` reader of the folder ``path`` whose index (``.metadata``, which DCP
    unpickles with plain ``pickle``) was scanned first: it names only DCP's own index types
    (:data:`~hf_lightning.checkpointing.safe_load.DCP_METADATA_TYPES`).

    Raises:
        UnsafeCheckpointError: the index names another pickled type (nothing of it is unpickled).
        OSError, ValueError: the index cannot be read, or is not a pickle.
    """
    from torch.distributed.checkpoint import FileSystemReader

    from hf_lightning.checkpointing.safe_load import DCP_METADATA_TYPES, check_pickle_file

    check_pickle_file(os.path.join(path, DCP_METADATA), DCP_METADATA_TYPES)
    return FileSystemReader(Path(path))


def shard_planner() -> Any:
    """DCP's default load planner, whose non-tensor entries (stored as ``torch.save`` bytes inside the shards,
    which DCP unpickles without the weights-only restriction) load through
    :func:`~hf_lightning.checkpointing.safe_load.load_checkpoint_file` instead."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from hf_lightning.checkpointing.safe_load import load_checkpoint_file

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            # built by the restricted loader, then handed to DCP as bytes of those objects only
            checked = io.BytesIO()
            torch.save(load_checkpoint_file(value), checked)
            checked.seek(0)
            super().load_bytes(read_item, checked)

    return SafeLoadPlanner()


def load_shards(state: dict[str, Any], path: str, no_dist: bool = False) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from the folder ``path`` through
    :func:`shard_reader` and :func:`shard_planner` (a collective unless ``no_dist``).

    Raises:
        UnsafeCheckpointError: the index or a stored entry names a pickled type outside the allow-list (as
            it is, not wrapped in DCP's ``CheckpointException``).
        CheckpointException: anything else DCP raises (a key missing, a shape that differs).
    """
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        load(state, storage_reader=shard_reader(path), planner=shard_planner(), no_dist=no_dist)
    except CheckpointException as err:
        for failure, _ in err.failures.values():
            if isinstance(failure, UnsafeCheckpointError):
                raise failure from None
        raise


def stored_keys(path: str) -> list[str]:
    """The fully qualified keys DCP stored in ``path`` (``state_dict.model.lm_head.weight``,
    ``optimizer_0.state.model....exp_avg``, ...), read from its scanned index (:func:`shard_reader`)."""
    return sorted(shard_reader(path).read_metadata().state_dict_metadata)


def sharded_checkpoint_problem(path: str, weights_only: bool = False) -> tuple[str | None, int | None]:
    """``(why the folder path cannot be resumed from, its global_step)``: as
    :func:`~hf_lightning.checkpointing.resume.checkpoint_problem` for a file.

    Only rank 0 of a launched job hashes the files (every rank checks the listing and reads ``meta.pt`` and
    the index): the other ranks load the checkpoint rank 0 chose, and its verdict on the hashes, broadcast by
    :meth:`AtomicShardedCheckpoints.load_checkpoint` (under Lightning's launcher rank 0 has checked the folder
    before it starts them)."""
    from hf_lightning.checkpointing.resume import REQUIRED_KEYS, _short
    from hf_lightning.compat import launcher_rank

    problem = folder_problem(path, hash_files=launcher_rank() == 0)
    if problem:
        return problem, None
    if is_deepspeed_checkpoint(path):
        return _deepspeed_checkpoint_problem(path, weights_only)
    for name, what in ((META, "the loop state"), (DCP_METADATA, "the index of the shards")):
        if not os.path.isfile(os.path.join(path, name)):
            return f"is damaged: it holds no {name} ({what}; a sharded checkpoint folder has one)", None
    try:
        meta = read_meta(path)
        keys = stored_keys(path)
    except UnsafeCheckpointError as err:  # refused unread
        return unsafe_part(path, err), None
    except Exception as err:  # a truncated pickle, an unreadable index
        return f"is damaged: not a readable checkpoint folder ({_short(err)})", None
    if not isinstance(meta, dict):
        return "is not a Lightning checkpoint", None
    step = meta.get("global_step")
    problem = shard_problem(path, meta)
    if problem:
        return problem, step
    has = {
        "state_dict": any(k.startswith("state_dict.") for k in keys),
        "optimizer_states": any(k.startswith("optimizer_0.") for k in keys),
    }
    needed = ("state_dict",) if weights_only else REQUIRED_KEYS
    missing = [k for k in needed if not has.get(k, bool(meta.get(k)))]
    if missing:
        return f"lacks {', '.join(missing)}", step
    return None, step


def unsafe_part(path: str, err: Any) -> str:
    """The reason, read after the folder's name, that a file in it was refused unread (``is refused: meta.pt
    holds a pickled TYPE, ...``)."""
    return f"is refused: {os.path.relpath(err.path, path)} {err.reason}"


def deepspeed_tag_folder(path: str) -> str:
    """The tag folder of a DeepSpeed checkpoint folder (the name its ``latest`` holds).

    Raises:
        OSError: ``latest`` cannot be read.
    """
    with open(os.path.join(path, DS_LATEST)) as fh:
        return os.path.join(path, fh.read().strip())


def deepspeed_client_state(path: str) -> dict[str, Any]:
    """Rank 0's model-states file of a DeepSpeed checkpoint folder (``mp_rank_00_model_states.pt``, under
    ZeRO-3 ``zero_pp_rank_0_mp_rank_00_model_states.pt``): DeepSpeed's entries with Lightning's checkpoint
    (loops, schedulers, callbacks, ``global_step``) beside them.

    Raises:
        FileNotFoundError: neither file is there; OSError, pickle errors: as ``torch.load``.
    """
    from hf_lightning.checkpointing.safe_load import DEEPSPEED_TYPES, load_checkpoint_file

    tag = deepspeed_tag_folder(path)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if os.path.isfile(os.path.join(tag, name)):
            return load_checkpoint_file(os.path.join(tag, name), allowed=DEEPSPEED_TYPES)
    raise FileNotFoundError(f"no model states file in {tag}")


def check_deepspeed_states(path: str) -> None:
    """Scan every states file (``*.pt``) of the DeepSpeed checkpoint folder ``path`` before DeepSpeed reads
    them: its engine (``load_checkpoint``) and ``zero_to_fp32`` unpickle them without the weights-only
    restriction, so a file naming a type outside
    :data:`~hf_lightning.checkpointing.safe_load.DEEPSPEED_TYPES` and torch's defaults is refused first
    (nothing of it is unpickled).

    Raises:
        UnsafeCheckpointError: the first such file, naming the type.
        OSError, ValueError: a file cannot be read, or is not a pickle.
    """
    from hf_lightning.checkpointing.safe_load import DEEPSPEED_TYPES, check_pickle_file

    for root, _, names in sorted(os.walk(path)):
        for name in sorted(names):
            if name.endswith(".pt"):
                check_pickle_file(os.path.join(root, name), DEEPSPEED_TYPES)


def _deepspeed_checkpoint_problem(path: str, weights_only: bool) -> tuple[str | None, int | None]:
    """:func:`sharded_checkpoint_problem` for a DeepSpeed folder (its manifest already checked)."""
    from hf_lightning.checkpointing.resume import REQUIRED_KEYS, _short

    try:
        tag = deepspeed_tag_folder(path)
        if not os.path.isdir(tag):
            return (
                f"is damaged: its {DS_LATEST} names {os.path.basename(tag)}, which is not a folder in it",
                None,
            )
        check_deepspeed_states(path)
        state = deepspeed_client_state(path)
    except UnsafeCheckpointError as err:  # refused unread
        return unsafe_part(path, err), None
    except FileNotFoundError as err:
        return f"is damaged: it holds no DeepSpeed model states ({_short(err)})", None
    except Exception as err:  # a truncated pickle
        return f"is damaged: not a readable checkpoint folder ({_short(err)})", None
    if not isinstance(state, dict):
        return "is not a Lightning checkpoint", None
    step = state.get("global_step")
    has = {
        "state_dict": "module" in state,
        "optimizer_states": any(n.endswith("optim_states.pt") for n in os.listdir(tag)),
    }
    needed = ("state_dict",) if weights_only else REQUIRED_KEYS
    missing = [k for k in needed if not has.get(k, bool(state.get(k)))]
    if missing:
        return f"lacks {', '.join(missing)}", step
    return None, step


def saved_world(meta: dict[str, Any]) -> dict[str, Any]:
    """The data signature ``ResumeState`` stored (world size, per-device batch, accumulation); ``{}``
    without one."""
    return dict(((meta.get("hf_lightning") or {}).get("signature")) or {})


def rows_per_step(signature: dict[str, Any]) -> int | None:
    """Rows per optimizer step of a data signature: ranks x per-device batch x accumulation (``None`` when a
    factor is unknown)."""
    try:
        return (
            int(signature["world_size"])
            * int(signature["per_device_train_batch_size"])
            * int(signature.get("gradient_accumulation_steps") or 1)
            * int(signature.get("accumulate_grad_batches") or 1)
        )
    except (KeyError, TypeError, ValueError):
        return None


def resharding_problem(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a checkpoint written with ``saved``'s world size cannot resume exactly with ``current``'s (both
    data signatures), or ``None``: same world size, or another one with the same rows per optimizer step
    (the train loader's position, in windows, then names the same rows of the global order)."""
    if not saved or saved.get("world_size") == current.get("world_size"):
        return None
    before, now = rows_per_step(saved), rows_per_step(current)
    if before is None or before == now:
        return None
    batch = int(saved.get("per_device_train_batch_size") or 0)
    accumulation = int(saved.get("gradient_accumulation_steps") or 1)
    world = int(current.get("world_size") or 1)
    hint = (
        f"set data.per_device_train_batch_size={before // (world * accumulation)}"
        if before % (world * accumulation) == 0
        else f"choose data.per_device_train_batch_size x data.gradient_accumulation_steps = {before // world}"
        if before % world == 0
        else f"run on {saved.get('world_size')} ranks"
    )
    return (
        f"it was written by {saved.get('world_size')} ranks x {batch} rows x {accumulation} micro-batches = "
        f"{before} rows per optimizer step, and this run takes {now}: the checkpoint's data position "
        f"(windows consumed) would name other rows; {hint} to keep {before} rows per step"
    )


def write_shards(state: dict[str, Any], folder: str) -> None:
    """``torch.distributed.checkpoint.save`` of ``state`` into ``folder`` (a collective: every rank writes its
    shard, files fsync'd; rank 0 writes the index)."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    save(state, storage_writer=FileSystemWriter(folder, sync_files=True))


def stamp_shards(state: dict[str, Any], rest: dict[str, Any], token: int, rank: int, world_size: int) -> None:
    """Stamp one save of a DCP folder, so that a shard of another save cannot pass for one of its own:
    ``state`` (what this rank writes into its shard) gets ``hf_lightning_shard.RANK``, a tensor ``[token,
    rank, world_size, global_step]``; ``rest`` (``meta.pt``) gets the expected values. ``token`` is one
    random number per save, the same on every rank (rank 0's, broadcast). A manifest rewritten over a
    foreign shard still lists the right hashes; the stamps inside the shards then disagree with ``meta.pt``
    (:func:`shard_problem`)."""
    step = int(rest.get("global_step", -1))
    state[f"{SHARD_STAMP}.{rank}"] = torch.tensor([token, rank, world_size, step], dtype=torch.int64)
    rest[SHARD_STAMP] = {"token": token, "world_size": world_size, "global_step": step}


def shard_problem(path: str, meta: dict[str, Any] | None = None) -> str | None:
    """Why the shards of the DCP folder ``path`` are not all this checkpoint's own, or ``None``: a shard file
    its index names is missing, or a rank's stamp (:func:`stamp_shards`) is absent, unreadable, or differs
    from ``meta.pt``'s (a shard of another save or another run). Each stamp is read from the file the index
    places it in, alone (no collective). A folder written before the stamps existed is checked for missing
    shards only.

    Raises:
        UnsafeCheckpointError: ``meta.pt`` or the index names a pickled type outside the allow-list.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    from hf_lightning.checkpointing.resume import _short
    from hf_lightning.compat import dcp_entry_files

    meta = read_meta(path) if meta is None else meta
    metadata = shard_reader(path).read_metadata()
    files = dcp_entry_files(metadata)
    named = sorted(set().union(*files.values())) if files else []
    missing = [f for f in named if not os.path.isfile(os.path.join(path, f))]
    if missing:
        return f"is damaged: its shard {missing[0]} is missing (its index {DCP_METADATA} names it)"
    expected = meta.get(SHARD_STAMP) if isinstance(meta, dict) else None
    if not expected:
        return None
    world, step, token = int(expected["world_size"]), int(expected["global_step"]), int(expected["token"])
    for rank in range(world):
        key = f"{SHARD_STAMP}.{rank}"
        shard = ", ".join(sorted(files.get(key, ()))) or f"rank {rank}'s shard"
        if key not in metadata.state_dict_metadata:
            return (
                f"is damaged: its index {DCP_METADATA} holds no stamp of rank {rank} ({world} ranks wrote it)"
            )
        state = {key: torch.zeros(4, dtype=torch.int64)}
        try:
            load_shards(state, path, no_dist=True)
        except UnsafeCheckpointError:
            raise
        except (Exception, CheckpointException) as err:  # the bytes there are not a stamp
            return (
                f"is refused: its shard {shard} does not hold rank {rank}'s stamp where its index places it "
                f"({_short(err)}), so it is not this checkpoint's shard; loading it would mix weights"
            )
        got = [int(v) for v in state[key].tolist()]
        if got != [token, rank, world, step]:
            return (
                f"is refused: its shard {shard} belongs to another checkpoint (its stamp: rank {got[1]} of "
                f"{got[2]}, step {got[3]}{', another save' if got[0] != token else ''}; meta.pt: rank {rank} "
                f"of {world}, step {step}), so loading it would mix weights; resume from another checkpoint"
            )
    return None


class AtomicShardedCheckpoints:
    """A mixin for a strategy that writes a checkpoint as a folder, each rank its part (Lightning's
    ``ModelParallelStrategy``, ``DeepSpeedStrategy``; put it first among the bases): its checkpoint folders
    are written atomically with a SHA-256 manifest, verified on load, and removed whole.

    ``save_checkpoint``: every rank writes its part into the temporary folder rank 0 named
    (:meth:`_write_parts`), then rank 0 its own part (:meth:`_write_rest`) and :data:`MANIFEST`, and renames
    the folder into place. The default parts are Lightning's DCP layout (``state_dict`` and ``optimizer_N``
    in DCP, the rest in ``meta.pt``), so Lightning's own load reads it; a DeepSpeed strategy overrides
    :meth:`_write_parts` with its engine's ``save_checkpoint`` and :meth:`_load_folder` with its load. A
    ``save_distributed_checkpoint=False`` strategy writes one file through its ``CheckpointIO`` as Lightning
    does.

    Raises (``save_checkpoint``):
        TrainingError: the disk refused a write (full, read-only, permissions): names the folder, the reason
            and the free space; the previous checkpoint is intact.
    Raises (``load_checkpoint``):
        ConfigError: the folder fails its manifest (damaged), or a shard is missing or is not this
            checkpoint's own (:func:`shard_problem`), or a file in it names a pickled type outside the
            allow-list (:mod:`~hf_lightning.checkpointing.safe_load`).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if not self._distributed_save() or storage_options is not None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]
        path = os.fspath(self.broadcast(os.fspath(filepath)))  # type: ignore[attr-defined]
        try:
            self._save_folder(checkpoint, path)
        except Exception as err:
            from hf_lightning.checkpointing.files import disk_error
            from hf_lightning.checkpointing.io import save_failure_message
            from hf_lightning.core.errors import TrainingError

            cause = disk_error(err)
            if cause is not None:
                raise TrainingError(save_failure_message(path, cause)) from err
            raise

    def _distributed_save(self) -> bool:
        from hf_lightning.compat import saves_distributed_checkpoint

        return saves_distributed_checkpoint(self)

    def _save_folder(self, checkpoint: dict[str, Any], path: str) -> None:
        zero = self.global_rank == 0  # type: ignore[attr-defined]
        with atomic_folder(path) if zero else contextlib.nullcontext(None) as tmp:
            tmp = self.broadcast(tmp)  # type: ignore[attr-defined]
            rest = self._write_parts(checkpoint, tmp)
            self.barrier("sharded checkpoint written")  # type: ignore[attr-defined]
            if zero:
                self._write_rest(rest, tmp)
                write_manifest(tmp)
                fsync_folder(tmp)
        self.barrier("sharded checkpoint in place")  # type: ignore[attr-defined]

    def _write_parts(self, checkpoint: dict[str, Any], folder: str) -> dict[str, Any]:
        """Every rank (a collective): write this rank's part of ``checkpoint`` into ``folder`` (fsync'd);
        returns what rank 0 writes after the barrier (:meth:`_write_rest`). Here: the model's and the
        optimizers' shards in DCP, the rest for ``meta.pt``."""
        import secrets

        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        zero = self.global_rank == 0  # type: ignore[attr-defined]
        token = self.broadcast(secrets.randbits(62) if zero else None)  # type: ignore[attr-defined]
        stamp_shards(state, checkpoint, token, self.global_rank, self.world_size)  # type: ignore[attr-defined]
        write_shards(state, folder)
        return checkpoint

    def _write_rest(self, rest: dict[str, Any], folder: str) -> None:
        """Rank 0, after every rank's part is written: ``meta.pt`` (loops, schedulers, callbacks, ...)."""
        torch.save(rest, os.path.join(folder, META))

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a checkpoint folder, checked against its manifest on rank 0 (the verdict broadcast), into the
        sharded model and optimizers and return the rest; a file goes to Lightning's own load.

        Raises:
            ConfigError: the folder fails its manifest.
        """
        from hf_lightning.core.errors import ConfigError

        path = os.fspath(self.broadcast(os.fspath(checkpoint_path)))  # type: ignore[attr-defined]
        if not is_sharded_checkpoint(path):
            if os.path.isfile(path):  # Lightning's own load of a file: scanned, then weights_only
                from hf_lightning.checkpointing.safe_load import check_pickle_file

                check_pickle_file(path)
            return super().load_checkpoint(path, weights_only=True)  # type: ignore[misc]
        problem = None
        if self.global_rank == 0:  # type: ignore[attr-defined]
            problem = folder_problem(path)
            if problem is None and not is_deepspeed_checkpoint(path):
                try:
                    problem = shard_problem(path)
                except UnsafeCheckpointError as err:
                    problem = unsafe_part(path, err)
        problem = self.broadcast(problem)  # type: ignore[attr-defined]
        if problem:
            raise ConfigError(f"{path} {problem}")
        return self._load_folder(path, weights_only)

    def _load_folder(self, path: str, weights_only: bool | None) -> dict[str, Any]:
        """The DCP folder ``path`` into the sharded model and optimizers (resharded when the world size
        differs); returns ``meta.pt``.

        The model's keys the folder lacks must be frozen (an adapter checkpoint keeps its trainable weights
        only, :func:`~hf_lightning.adapters.checkpoint.drop_frozen`); they keep the weights as built.
        """
        model = self.model  # type: ignore[attr-defined]
        stored = {k.removeprefix("state_dict.") for k in stored_keys(path)}
        # a tied weight (an LM head sharing the embedding) is one Parameter under two names: both are frozen
        frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        missing = [k for k in model.state_dict() if k not in stored and k not in frozen]
        if missing:
            from hf_lightning.checkpointing.weights import weights_mismatch_message
            from hf_lightning.core.errors import ModelError

            raise ModelError(
                weights_mismatch_message(
                    path, None, f"{len(missing)} weights missing from the checkpoint, e.g. {missing[:3]}"
                )
            )
        load_sharded_weights(model, path)
        _load_optimizers(model, self.optimizers, path)  # type: ignore[attr-defined]
        return read_meta(path)

    def remove_checkpoint(self, filepath: Any) -> None:
        import shutil

        if self.global_rank == 0:  # type: ignore[attr-defined]
            path = os.fspath(filepath)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                from hf_lightning.checkpointing.io import checksum_path

                with contextlib.suppress(FileNotFoundError):
                    os.unlink(checksum_path(path))


def load_sharded_weights(module: torch.nn.Module, path: str) -> None:
    """Load the ``state_dict`` of the checkpoint folder ``path`` into ``module`` (sharded or not: DCP reads
    each rank's part, resharded as needed); keys of ``module`` the folder does not hold are left as they are
    (:func:`~hf_lightning.checkpointing.weights.load_model_weights` checks the model's keys first). A
    collective when ``module`` is sharded.

    Raises:
        RuntimeError (DCP's ``CheckpointException``): a key of ``module`` missing from the folder, or a shape
            that differs (the caller words it).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    stored = {k.removeprefix("state_dict.") for k in stored_keys(path)}
    own = get_model_state_dict(module)
    state = {"state_dict": {k: v for k, v in own.items() if k in stored}}
    load_shards(state, path)
    set_model_state_dict(module, state["state_dict"], options=StateDictOptions(strict=False))


def _load_optimizers(model: torch.nn.Module, optimizers: list[Any], path: str) -> None:
    """Each optimizer's state from ``optimizer_N`` of the folder (``get_optimizer_state_dict`` /
    ``set_optimizer_state_dict``, as Lightning's own load)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        state = {key: get_optimizer_state_dict(model, optimizer)}
        load_shards(state, path)
        set_optimizer_state_dict(
            model, optimizer, optim_state_dict=state[key], options=StateDictOptions(cpu_offload=True)
        )
