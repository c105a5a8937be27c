"""After a resume, the checkpoint folder holds what the run held at the checkpoint's step, nothing more, and
its ``ModelCheckpoint`` callbacks go on as in the run that never stopped.

A kill can leave periodic checkpoints that the restored ``ModelCheckpoint`` state does not know: one written
after the checkpoint the run resumes from (the kill came before ``last.ckpt`` was updated), or one rotated out
whose deletion the kill prevented. Lightning's ``ModelCheckpoint`` would then keep them forever (more files
than ``save_top_k``) and, meeting one's name again, write ``-v1`` copies. The resumed run writes the newer
ones again, bit for bit, so they are removed; and a ``last.ckpt`` that the restored state does not name (a
resume from an earlier checkpoint) is adopted, so the next save replaces it instead of writing
``last-v1.ckpt``.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from typing import Any

from hf_lightning.compat import mark_saved_at

log = logging.getLogger(__name__)


def _name_pattern(template: str, extension: str) -> re.Pattern[str]:
    """A regex for the file names a ``ModelCheckpoint`` filename template produces (any values, any
    version)."""
    parts = re.split(r"\{[^}]*\}", template)
    body = ".+?".join(re.escape(p) for p in parts)
    return re.compile(rf"^{body}(-v\d+)?{re.escape(extension)}$")


def restored_dirpaths(checkpoint: dict) -> set[str]:
    """The folders of the ``ModelCheckpoint`` states a checkpoint holds: Lightning restores such a state only
    into a callback with the same ``dirpath`` (a run folder that was moved or copied restores none)."""
    states = (checkpoint.get("callbacks") or {}).values()
    return {
        str(st["dirpath"])
        for st in states
        if isinstance(st, dict) and "best_k_models" in st and st.get("dirpath")
    }


def tidy_checkpoint_folders(trainer: Any, restored: set[str] | None = None) -> list[str]:
    """Remove the periodic checkpoints no ``ModelCheckpoint`` knows (rank 0), for the callbacks whose state
    was restored from the checkpoint (``restored``: their folders; a callback that restored nothing knows no
    file, and its folder is left as it is); adopt an unknown ``last.ckpt``; returns the removed paths."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
    for cb in callbacks:
        if trainer.global_step > 0:
            # the run resumes from a checkpoint written after every save due at its step (Lightning's private
            # counter is not in the checkpoint: without it, the next micro-batch of an accumulation window
            # would save the step again, as a -v1 copy that rotates out a checkpoint the run keeps). Every
            # rank: saves are collectives
            mark_saved_at(cb, trainer.global_step)
        if cb.save_last:
            last = os.path.abspath(cb.format_checkpoint_name({}, cb.CHECKPOINT_NAME_LAST))
            # a file, or a sharded run's checkpoint folder
            if os.path.exists(last) and os.path.abspath(cb.last_model_path or "") != last:
                cb.last_model_path = last  # Lightning's attribute: the next "last" save replaces it
    if not trainer.is_global_zero:
        return []
    known = set()
    for cb in callbacks:
        known |= {
            os.path.abspath(p) for p in (*cb.best_k_models, cb.best_model_path, cb.last_model_path) if p
        }
    removed = []
    for cb in callbacks:
        if cb.save_top_k == -1 or cb.monitor is None or str(cb.dirpath) not in (restored or set()):
            # keeps every checkpoint, or only the newest under one name, or knows nothing of the folder
            continue
        pattern = _name_pattern(cb.filename or "{epoch}-{step}", cb.FILE_EXTENSION)
        for path in sorted(glob.glob(os.path.join(cb.dirpath, "*" + cb.FILE_EXTENSION))):
            if os.path.abspath(path) not in known and pattern.match(os.path.basename(path)):
                trainer.strategy.remove_checkpoint(path)
                removed.append(path)
    if removed:
        log.warning(
            "removed checkpoints that the run's state at step %d does not hold (written after it, or "
            "rotated out), so save_top_k holds: %s",
            trainer.global_step,
            ", ".join(removed),
        )
    return removed
