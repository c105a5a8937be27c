"""Hub ids for ``model.name_or_path`` and ``data.path``: what counts as one, and the one-line error when one
cannot be loaded.

Resolution itself is ``transformers``' ``from_pretrained`` and ``datasets``' ``load_dataset`` with their own
cache (``HF_HOME``, ``HF_HUB_CACHE``, ``HF_DATASETS_CACHE``) and their own offline switch (``HF_HUB_OFFLINE``,
which no entry point of ours sets): nothing here downloads or caches anything. This module only tells a hub id
from a local path, and turns the loaders' many exception types into one line naming the id, the cache looked
in and the ``hf download`` command that fills it beforehand.
"""

from __future__ import annotations

import os
from typing import Any


def looks_like_hub_id(value: Any) -> bool:
    """Whether ``value`` is a hub repository id (``org/name`` or ``name``) rather than a local path.

    A string that exists on disk, starts like a path (``/``, ``.``, ``~``), names a file by its suffix
    (``.ckpt``, ``.json``, ...) or fails ``huggingface_hub.utils.validate_repo_id`` is a path.
    """
    if not isinstance(value, str) or not value or os.path.exists(value):
        return False
    if value.startswith(("/", ".", "~", "pkg:")) or os.sep in value.replace("/", "", 1):
        return False
    if os.path.splitext(value)[1].lower() in (".ckpt", ".json", ".jsonl", ".csv", ".parquet", ".txt", ".pt"):
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE``) as the loaders read it."""
    from huggingface_hub import constants

    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))
    return constants.is_offline_mode() or any(f.upper() in ("1", "ON", "YES", "TRUE") for f in flags)


def model_cache() -> str:
    """The folder ``from_pretrained`` caches hub files in (``HF_HUB_CACHE``, default ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def dataset_cache() -> str:
    """The folder ``load_dataset`` keeps prepared hub datasets in (``HF_DATASETS_CACHE``)."""
    import datasets

    return str(datasets.config.HF_DATASETS_CACHE)


def _causes(err: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def _reason(err: BaseException) -> str:
    """Why a hub id could not be loaded, in a few words, from the exception chain of the loader."""
    names = {type(e).__name__ for e in _causes(err)}
    text = " ".join(" ".join(str(e).split()) for e in _causes(err)).lower()
    if "GatedRepoError" in names or "trying to access a gated repo" in text or "is a gated" in text:
        return "it is a gated repository: request access on its hub page, then log in with `hf auth login`"
    if "RevisionNotFoundError" in names or "revision" in text and "not found" in text:
        return "the revision does not exist in that repository"
    if (
        "RepositoryNotFoundError" in names
        or "not a valid model identifier" in text
        or "doesn't exist" in text
    ):
        if offline():
            return "offline (HF_HUB_OFFLINE=1) and not in the cache"
        return "no such repository on the hub (or it is private: log in with `hf auth login`)"
    if offline():
        return "offline (HF_HUB_OFFLINE=1) and not in the cache"
    return "not in the cache and the hub could not be reached"


def hub_error_message(
    key: str, repo_id: str, kind: str, revision: str | None, err: BaseException, name: str | None = None
) -> str:
    """The one line for a hub id the loader refused.

    Args:
        key: the config key (``model.name_or_path``, ``data.path``, ...).
        kind: ``model`` or ``dataset`` (the cache and the way to fill it differ: ``load_dataset`` offline
            reads only the datasets cache it prepared itself, not files fetched by ``hf download``).
        revision: the revision asked for (``None``: the default branch).
        name: a dataset's config name (``data.name``).
    """
    where = f"{repo_id}{f' (revision {revision})' if revision else ''} could not be loaded: {_reason(err)}"
    if kind == "model":
        flags = f" --revision {revision}" if revision else ""
        return (
            f"{key}={repo_id}: not a local folder, and the hub model {where} (cache looked in: "
            f"{model_cache()}); fetch it beforehand with `hf download {repo_id}{flags}` on a machine with "
            "internet and the same HF_HOME"
        )
    args = ", ".join(
        [repr(repo_id), *([repr(name)] if name else []), *([f"revision={revision!r}"] if revision else [])]
    )
    flags = " --repo-type dataset" + (f" --revision {revision}" if revision else "")
    return (
        f"{key}={repo_id}: not a local file or folder, and the hub dataset {where} (cache looked in: "
        f"{dataset_cache()}); prepare it beforehand on a machine with internet and the same HF_HOME with "
        f'`python -c "import datasets; datasets.load_dataset({args})"` (`hf download {repo_id}{flags}` alone '
        "fills only the hub cache, which load_dataset does not read offline)"
    )
