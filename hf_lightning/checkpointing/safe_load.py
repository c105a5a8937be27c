"""The one loader of every checkpoint, weight and state file hf_lightning reads: none of them can run code.

A checkpoint is a pickle, and unpickling builds whatever classes and calls whatever functions the file names
(an object whose ``__reduce__`` is ``os.system`` runs a command when ``torch.load`` unpickles it without its
weights-only restriction). A checksum does not help: whoever can replace the file can rewrite its ``.sha256``
too. So every file is read in two steps:

1. **scanned**: the pickle is disassembled (``pickletools``, nothing is built or called) and every global it
   names (``GLOBAL``, ``STACK_GLOBAL``, ``INST``) is checked against the types our checkpoints hold:
   torch's own ``weights_only`` set (tensors, storages, dtypes, ``OrderedDict``, ...) and the extra ones in
   :data:`EXTRA_TYPES`. The first other one is refused in one line naming it
   (:class:`~hf_lightning.core.errors.UnsafeCheckpointError`), before any of the file is unpickled;
2. **loaded** with ``torch.load(weights_only=True)`` under ``torch.serialization.safe_globals(EXTRA_TYPES)``:
   torch's restricted unpickler, which enforces the same list as it builds the objects.

Files that other libraries unpickle themselves (DeepSpeed's engine and ``zero_to_fp32`` read their states with
the weights-only restriction off; ``torch.distributed.checkpoint`` reads its ``.metadata`` index with
``pickle.load``) are scanned by :func:`check_pickle_file` first, against the types those files hold, and
refused the same way.

Our checkpoints hold plain types on purpose (the resume state keeps the RNG states as numbers and tensors,
:mod:`hf_lightning.callbacks.resume_state`): :data:`EXTRA_TYPES` stays empty for Lightning checkpoints and
``meta.pt``; what DCP's index and DeepSpeed's states hold is listed in :data:`DCP_METADATA_TYPES` and
:data:`DEEPSPEED_TYPES`.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import zipfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

from hf_lightning.core.errors import UnsafeCheckpointError

#: types beyond torch's ``weights_only`` defaults that a Lightning checkpoint or ``meta.pt`` of ours may hold
#: (none: the resume state, the train log and Lightning's own loop and callback states are plain values)
EXTRA_TYPES: tuple[str, ...] = ()

#: what ``torch.distributed.checkpoint``'s ``.metadata`` index holds beyond torch's defaults: ``Metadata`` and
#: its parts, ``FileSystemWriter``'s storage entries, the checkpoint id (a path), sizes, layouts, formats
DCP_METADATA_TYPES: tuple[str, ...] = (
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.serialization._get_layout",
    "torch.Size",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
)


#: what DeepSpeed's model and optimizer states hold beyond torch's defaults (the optimizer's loss scaler, the
#: ZeRO stage, each parameter's place in the flat partition)
DEEPSPEED_TYPES: tuple[str, ...] = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def _torch_defaults() -> frozenset[str]:
    from hf_lightning.compat import weights_only_default_globals

    return weights_only_default_globals()


def _pickles(source: str | bytes) -> Iterator[IO[bytes]]:
    """Each pickle stream of ``source`` (a path, or a file's bytes): the ``data.pkl`` of a torch zip archive,
    or the whole file (a legacy ``torch.save`` file is several pickles in a row; a plain pickle is one)."""
    if isinstance(source, bytes):
        data = source
    else:
        with open(source, "rb") as fh:
            data = fh.read()
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                streams = [io.BytesIO(archive.read(n)) for n in archive.namelist() if n.endswith(".pkl")]
        except (zipfile.BadZipFile, EOFError) as err:
            raise ValueError(f"not a readable torch archive ({err})") from None
        yield from streams
        return
    yield io.BytesIO(data)


def _globals(stream: IO[bytes]) -> Iterator[str]:
    """``module.name`` of each global the pickles in ``stream`` name (``GLOBAL``, ``INST``, ``STACK_GLOBAL``
    with its two strings followed through the memo), in order, by disassembly: nothing is built or called.

    Raises:
        ValueError: the bytes are not a pickle (the caller words it as damage).
    """
    while True:
        start = stream.tell()
        if not stream.read(1):
            return
        stream.seek(start)
        strings: list[str] = []  # the strings pushed so far (STACK_GLOBAL takes the last two)
        memo: dict[int, str] = {}
        try:
            for op, arg, _ in pickletools.genops(stream):
                name = op.name
                if name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "STRING"):
                    strings.append(str(arg))
                elif name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                    key = len(memo) if name == "MEMOIZE" else int(arg)
                    memo[key] = strings[-1] if strings else ""
                elif name in ("BINGET", "LONG_BINGET", "GET"):
                    strings.append(memo.get(int(arg), ""))
                elif name in ("GLOBAL", "INST"):
                    module, _, attr = str(arg).partition(" ")
                    yield f"{module}.{attr}"
                elif name == "STACK_GLOBAL":
                    yield f"{strings[-2]}.{strings[-1]}" if len(strings) >= 2 else "an unnamed global"
        except (ValueError, EOFError) as err:
            raise ValueError(f"not a pickle ({err})") from None


def unsafe_globals(path: str | bytes, allowed: Iterable[str] = ()) -> list[str]:
    """The globals the pickle(s) of ``path`` (or of a file's bytes) name that are neither torch's
    ``weights_only`` defaults nor in ``allowed`` nor :data:`EXTRA_TYPES`, in the order they appear (each
    once; Python 2 names as Python 3 spells them). Nothing is unpickled.

    Raises:
        OSError: the file cannot be read. ValueError: not a pickle or a torch archive.
    """
    ok = _torch_defaults() | set(allowed) | set(EXTRA_TYPES)
    found: list[str] = []
    for stream in _pickles(path):
        for name in _globals(stream):
            name = name.replace("__builtin__.", "builtins.", 1)
            if name not in ok and name not in found:
                found.append(name)
    return found


def refusal(name: str) -> str:
    """The reason, read after the file's name, for a file naming the pickled global ``name``."""
    return (
        f"holds a pickled {name}, a type no hf_lightning checkpoint holds: refused unread, since unpickling "
        "it could run code (load only checkpoints you trust)"
    )


def check_pickle_file(path: str, allowed: Iterable[str] = ()) -> None:
    """Refuse ``path`` when its pickle names a global outside torch's defaults, ``allowed`` and
    :data:`EXTRA_TYPES` (see the module doc); nothing is unpickled.

    Raises:
        UnsafeCheckpointError: ``PATH holds a pickled TYPE, ...`` naming the first such global.
        OSError: the file cannot be read. ValueError: not a pickle.
    """
    found = unsafe_globals(path, allowed)
    if found:
        raise _refused(path, found[0])


def load_checkpoint_file(
    path: Any, map_location: Any = "cpu", mmap: bool | None = None, allowed: Iterable[str] = ()
) -> Any:
    """``torch.load`` of a checkpoint, weights or state file, scanned first and then loaded with
    ``weights_only=True`` under :data:`EXTRA_TYPES` (see the module doc).

    Args:
        path: the file (a path; a file object is read into memory first).
        map_location: as ``torch.load`` (default ``"cpu"``).
        mmap: as ``torch.load``; ``None``: memory-mapped when the file is a torch zip archive.
        allowed: dotted names of further types this kind of file holds (:data:`DEEPSPEED_TYPES`).

    Raises:
        UnsafeCheckpointError: the file names a type outside the allow-list (before any of it is unpickled).
        FileNotFoundError, OSError: as ``open``. Anything else ``torch.load`` raises for a damaged file.
    """
    import torch

    if not isinstance(path, (str, os.PathLike)):  # a stream (DCP's bytes entries)
        data = path.read()
        try:
            found = unsafe_globals(data, allowed)
        except (ValueError, EOFError):
            found = []  # not a readable pickle: torch's restricted reader below says why
        if found:
            raise UnsafeCheckpointError(f"a stored entry {refusal(found[0])}")
        with torch.serialization.safe_globals(_resolve((*EXTRA_TYPES, *allowed))):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    path = os.fspath(path)
    try:
        check_pickle_file(path, allowed)
    except UnsafeCheckpointError:
        raise
    except (ValueError, EOFError):  # not a readable pickle: torch's restricted reader below says why
        pass
    if mmap is None:
        mmap = zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(_resolve((*EXTRA_TYPES, *allowed))):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:  # a type the scan could not see (built on the stack): named
        raise _refused(path, _named(err)) from None


def _refused(path: str, name: str) -> UnsafeCheckpointError:
    """``PATH holds a pickled NAME, ...``, with ``.path`` and ``.reason`` (the text after the path) for a
    caller that words the file its own way."""
    reason = refusal(name)
    err = UnsafeCheckpointError(f"{path} {reason}")
    err.path, err.reason = path, reason
    return err


def _named(err: BaseException) -> str:
    """The global torch's restricted unpickler refused, from its message."""
    import re

    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"unrecognized function (\S+)", text)
    return found.group(1) if found else "content outside torch's weights_only types"


def _resolve(names: Iterable[str]) -> list[Any]:
    """The objects of the dotted ``names`` (for ``torch.serialization.safe_globals``)."""
    import importlib

    objects = []
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        objects.append(getattr(importlib.import_module(module), attr))
    return objects
