"""The DataModule's loaders: its loader hooks (:class:`DataLoaderHooks`), :class:`EpochDataLoader`
(epoch-aware worker seeds, stream epochs) and :func:`batches_per_epoch` (their length without building them).
Training loaders are wrapped in :class:`~hf_lightning.data.sampling.AccumulationWindowLoader`
(``num_items_in_batch`` per window).

Ours, not a plain ``DataLoader``: HF ``Trainer`` seeds workers per epoch inside its own loop; Lightning has no
hook for it, so it lives in the loader.

Worker seeding. PyTorch seeds each worker's ``torch``, ``random`` and ``numpy`` from a base seed drawn from
the loader's ``generator`` plus the worker id. Here that generator is re-seeded at the start of every epoch
from ``(seed, rank, epoch)``, so random draws inside workers differ across workers, epochs and ranks, and
repeat with the same seed, including after a resume at an epoch boundary. (Lightning's
``seed_everything(workers=True)`` worker init derives its seeds from the same base seed, so it composes.) With
persistent workers the seeds are set once, when the workers start.

Epoch. Lightning calls ``set_epoch`` on the sampler of a map-style loader; the epoch is read from there. A
stream has no sampler, so the epoch comes from ``epoch_fn`` (the trainer's epoch) or, alone, from a count of
passes, and is handed to the dataset's ``set_epoch`` before each pass.

Without a Lightning trainer (a plain PyTorch loop, HF ``Trainer``) nobody calls ``set_epoch`` on the sampler
unless told to, and a ``DistributedSampler`` then repeats its first order every epoch. So the DataModule's
train loaders share one :class:`LoaderPosition`: every pass (``iter()``) is the next epoch, as a shuffling
``DataLoader`` draws a new order per pass; ``loader.set_epoch(e)`` (HF ``Trainer`` calls it) or
``loader.sampler.set_epoch(e)`` makes the next pass epoch ``e``. The position also counts the batches handed
out, so ``HFDataModule.state_dict()`` is a resume point a plain loop can save. The world size and rank come
from ``torch.distributed`` when a process group is initialized.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from hf_lightning.compat import dataset_fingerprint
from hf_lightning.core.batch import Window, to_device
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import check_fits_one_batch
from hf_lightning.data.placeholder import PlaceholderAwareCollator
from hf_lightning.data.sampling import (
    AccumulationWindowLoader,
    CountUse,
    ExactDistributedSampler,
    ResumableLoader,
    TopUpDataset,
    WindowBatch,
    WindowLoader,
    sequence_lengths,
    warn_no_count,
)
from hf_lightning.data.sources import is_stream
from hf_lightning.data.streams import ShardedStream, stream_batches

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)

# which side of a stream's validation hold-out each split reads (None: the split is a source of its own)
HOLDOUT_KEEPS = {"train": False, "validation": True, "test": None}
# HF's mega-batch multiplier cap (``get_length_grouped_indices``); streams group within buffers this many
# batches long
MEGA_BATCH_MULT = 50


def worker_base_seed(seed: int, rank: int, epoch: int) -> int:
    """A 63-bit seed that mixes ``seed``, ``rank`` and ``epoch`` (no two nearby triples collide in
    practice)."""
    digest = hashlib.blake2b(f"{seed}:{rank}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class LoaderPosition:
    """Where a training loop without a Lightning trainer stands in the data: the epoch of the current (or
    last) pass and the batches handed out in it.

    Every pass (``iter()`` of a train loader that holds it) is the next epoch, whether the previous one ran
    out or was left early; :meth:`set_epoch` picks the epoch of the next pass instead. After
    :meth:`load_state_dict` the next pass is the rest of the saved epoch (empty when it had been read to its
    end), and the passes after it continue from the next epoch.

    Under a Lightning trainer the train loader wrapper keeps the same two numbers itself
    (:meth:`~hf_lightning.data.sampling.ResumableLoader.state_dict`, the same keys).
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.batches_consumed = 0
        self._open = False  # a pass of ``epoch`` has begun (and not run out)

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch``, from its first batch."""
        self.epoch, self.batches_consumed, self._open = int(epoch), 0, False

    def begin(self) -> tuple[int, int]:
        """``(epoch, batches to skip)`` of the pass that starts now."""
        if self._open:  # the previous pass was left before its end
            self.set_epoch(self.epoch + 1)
        self._open = True
        return self.epoch, self.batches_consumed

    def track(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """``iterator``'s batches, each counted as it is handed out; running out ends the epoch."""
        for batch in iterator:
            self.batches_consumed += 1
            yield batch
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_consumed": self.batches_consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self.batches_consumed = int(state["batches_consumed"])


class EpochDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` with per-epoch worker seeds and stream epochs.

    Args:
        dataset: any dataset ``DataLoader`` takes.
        seed / rank: mixed with the epoch into the worker base seed.
        epoch_fn: ``() -> int``, the current epoch for a stream (e.g. the trainer's); ``None`` counts passes.
        position: a :class:`LoaderPosition` that decides the epoch of each pass and counts its batches (a loop
            without a Lightning trainer); ``None``: the epoch is the sampler's (Lightning sets it), else
            ``epoch_fn``'s, else the count of passes.
        **kwargs: ``DataLoader`` arguments (``batch_size``, ``sampler``, ``collate_fn``, ``num_workers``...).

    ``len()`` of a :class:`~hf_lightning.data.streams.ShardedStream` loader is exact when the stream length is
    known (each worker batches its own share); otherwise it raises ``TypeError`` like any unsized loader.
    """

    def __init__(
        self,
        dataset: Any,
        seed: int = 0,
        rank: int = 0,
        epoch_fn: Callable[[], int] | None = None,
        generator: torch.Generator | None = None,
        position: LoaderPosition | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset, generator=generator if generator is not None else torch.Generator(), **kwargs
        )
        self.seed = seed
        self.rank = rank
        self.epoch_fn = epoch_fn
        self.position = position
        self._passes = 0

    def current_epoch(self) -> int:
        if self.position is not None:
            return self.position.epoch
        sampler_epoch = getattr(self.sampler, "epoch", None)
        if sampler_epoch is not None:
            return int(sampler_epoch)
        if self.epoch_fn is not None:
            return int(self.epoch_fn())
        return self._passes

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch`` (``DistributedSampler.set_epoch``, for the whole loader; HF
        ``Trainer`` calls it before each epoch)."""
        if self.position is not None:
            self.position.set_epoch(epoch)
        elif callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)
        else:
            self._passes = int(epoch)

    def __iter__(self) -> Any:
        if self.position is None:
            return self._pass(self.current_epoch(), 0)
        if getattr(self.sampler, "epoch_given", False):  # the user called sampler.set_epoch
            self.sampler.epoch_given = False
            self.position.set_epoch(self.sampler.epoch)
        epoch, start = self.position.begin()
        if hasattr(self.sampler, "epoch"):
            self.sampler.epoch = epoch
        return self.position.track(self._pass(epoch, start))

    def _pass(self, epoch: int, start_batch: int) -> Any:
        self._passes += 1
        self.generator.manual_seed(worker_base_seed(self.seed, self.rank, epoch))
        if isinstance(self.dataset, ShardedStream):
            self.dataset.set_epoch(epoch)
        sampler = self.sampler
        if start_batch and hasattr(sampler, "start") and self.batch_size:
            sampler.start = start_batch * self.batch_size  # consumed by the sampler's next pass
            return super().__iter__()
        iterator = super().__iter__()
        for _ in range(start_batch):
            next(iterator, None)
        return iterator

    def iter_from(self, start_batch: int) -> Any:
        """An iterator that begins at batch ``start_batch`` of this epoch (resume).

        A map-style sampler with a ``start`` position jumps there: the skipped examples are neither read nor
        collated. A stream has no index to jump to, so its first ``start_batch`` batches are read and dropped.
        """
        return self._pass(self.current_epoch(), start_batch)

    def __len__(self) -> int:
        if isinstance(self.dataset, ShardedStream):
            n = self.dataset.num_batches(self.batch_size or 1, self.num_workers, self.drop_last)
            if n is None:
                raise TypeError("the length of this stream is unknown")
            return n
        return super().__len__()


POSITION_KEYS = ("epoch", "batches_consumed")


def data_signature(datamodule: Any, world_size: int) -> dict[str, Any]:
    """The settings the training data's order and batches depend on (a resume warns when one changed)."""
    return {
        "world_size": world_size,
        "per_device_train_batch_size": getattr(datamodule, "per_device_train_batch_size", None),
        "max_length": getattr(datamodule, "max_length", None),
        "seed": getattr(datamodule, "seed", None),
        "dataset_fingerprint": dataset_fingerprint(getattr(datamodule, "train_dataset", None)),
    }


def describe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: saved -> current"`` for every setting that differs (used to warn before an inexact resume)."""
    return [
        f"{k}: {saved.get(k)!r} -> {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]


def batches_per_epoch(
    n: int | None, *, stream: bool, world: int, batch_size: int, num_workers: int, drop_last: bool
) -> int | None:
    """``len()`` of the training loader, without building it: ``n`` rows (``None``: a stream of unknown
    length, then ``None``) split over ``world`` ranks as
    :class:`~hf_lightning.data.sampling.ExactDistributedSampler` (map-style: ``ceil(n / world)`` with the
    masked top-up, ``n // world`` with ``drop_last``) or :class:`~hf_lightning.data.streams.ShardedStream`
    (per reader, ``world x workers`` readers) does, then batched.
    """
    if stream:
        return stream_batches(n, world, batch_size, num_workers, drop_last)
    per_rank = n // world if drop_last else math.ceil(n / world)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)


class DataLoaderHooks:
    """The loader hooks of :class:`~hf_lightning.data.datamodule.HFDataModule` (a mixin: it reads the
    DataModule's arguments, its prepared splits and collators, and ``self.trainer`` for the world size, rank
    and accumulation).

    Map-style splits go through :class:`~hf_lightning.data.sampling.ExactDistributedSampler` (training: seeded
    order or length groups, masked top-up; evaluation: dataset order, no padding), streams through
    :class:`~hf_lightning.data.streams.ShardedStream` (exact per-reader split).
    """

    #: whether the first training step read ``num_items_in_batch`` (set by :meth:`train_dataloader`)
    _count_use: CountUse | None = None
    #: the train loader under a Lightning trainer, whose position counts the batches trained
    _train_loader: ResumableLoader | None = None
    _said_no_count = False

    def _lengths(self, ds: Any) -> list[int]:
        if self._train_lengths is not None:
            return self._train_lengths
        lengths = sequence_lengths(ds)
        log.info("group_by_length: measured %d training lengths once (tokens of input_ids)", len(lengths))
        return lengths

    def _first_example(self, ds: Any, split: str) -> Any:
        if is_stream(ds):
            stream = ShardedStream(
                ds,
                self._processor,
                holdout=self._holdout_spec(HOLDOUT_KEEPS[split]),
                split="validation" if split == "train" else split,
                name=self._source_name(split),
            )
            return next(iter(stream), None)
        return ds[0] if len(ds) else None

    def _source_name(self, split: str) -> Any:
        """Where ``split``'s rows come from, for messages."""
        if split == "test":
            return self.test_path if self.test_path is not None else self.path
        if split == "validation":
            return self.validation_path or self.path
        return self.path

    def _world(self) -> tuple[int, int]:
        """``(world size, rank)``: the Lightning trainer's, else the initialized ``torch.distributed`` process
        group's (HF ``Trainer``, a plain DDP loop), else ``(1, 0)``."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.world_size, trainer.global_rank
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    def _plain_loop_position(self) -> LoaderPosition | None:
        """The position shared by the train loaders of a loop without a Lightning trainer (``None`` under one:
        Lightning sets the epoch and keeps the position)."""
        if getattr(self, "trainer", None) is not None:
            return None
        saved, self._saved_signature = self._saved_signature, None
        if saved is not None:
            current = data_signature(self, self._world()[0])
            # a setting unknown when the state was saved (the data not set up yet) is not compared
            known = [k for k in current if saved.get(k) is not None]
            diffs = describe_differences({k: saved[k] for k in known}, {k: current[k] for k in known})
            if diffs:
                log.warning(
                    "resuming with data settings that changed since the state was saved, so the loop cannot "
                    "continue exactly as it would have: %s",
                    "; ".join(diffs),
                )
        world, rank = self._world()
        if world > 1:
            log.info(
                "no Lightning trainer: the training data is split across the %d processes of "
                "torch.distributed (this is rank %d)",
                world,
                rank,
            )
        return self._position

    def state_dict(self) -> dict[str, Any]:
        """The resume point of the training data in a loop without a Lightning trainer (a plain PyTorch
        loop): ``{"epoch": e, "batches_consumed": k, "signature": {...}}``, ``k`` batches of epoch ``e``
        handed out on this process, and the data settings they depend on. Save it with the model and the
        optimizer; :meth:`load_state_dict` on a new DataModule makes its train loaders continue with batch
        ``k + 1`` of epoch ``e``, as the loop that never stopped would.

        Under a Lightning trainer ``{}``: Lightning's loop state and the train loader's ``state_dict`` hold
        the position (Lightning saves a DataModule's non-empty state in its checkpoints).
        """
        if getattr(self, "trainer", None) is not None:
            return {}
        return {**self._position.state_dict(), "signature": data_signature(self, self._world()[0])}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass of the train loader is the rest of its epoch.

        A data setting that changed since (batch size, max length, seed, world size, the dataset) is named in
        a warning when the next train loader is built. ``{}`` does nothing (a Lightning checkpoint's).

        Raises:
            ConfigError: a mapping that is not a state of this method's kind.
        """
        if not state_dict:
            return
        epoch, consumed = (state_dict.get(k) if isinstance(state_dict, dict) else None for k in POSITION_KEYS)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, consumed)):
            found = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ConfigError(
                "HFDataModule.load_state_dict: expected the dict of HFDataModule.state_dict() (non-negative "
                f"int 'epoch' and 'batches_consumed'), got {found}"
            )
        self._position.load_state_dict({"epoch": epoch, "batches_consumed": consumed})
        self._saved_signature = state_dict.get("signature")

    def _accumulation(self) -> int:
        """Micro-batches per optimizer step: ``gradient_accumulation_steps`` for a module that steps windows,
        else Lightning's ``accumulate_grad_batches``."""
        if self.gradient_accumulation_steps > 1 or self._binding().steps_windows:
            return self.gradient_accumulation_steps
        trainer = getattr(self, "trainer", None)
        return int(getattr(trainer, "accumulate_grad_batches", 1) or 1) if trainer is not None else 1

    def _holdout_spec(self, keep: bool | None) -> tuple[float, bool] | None:
        return (self._holdout, keep) if self._holdout and keep is not None else None

    def _loader_kwargs(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "prefetch_factor": self.prefetch_factor,
        }

    def _stream_loader(self, source: Any, split: str, batch: int, collate_fn: Callable) -> EpochDataLoader:
        train = split == "train"
        world, rank = self._world()
        length_buffer = (
            MEGA_BATCH_MULT * batch * self._accumulation() if train and self.group_by_length else None
        )
        if length_buffer:
            log.info(
                "group_by_length on a stream: sorting by length within buffers of %d examples per reader "
                "(the whole stream cannot be sorted)",
                length_buffer,
            )
        holdout = self._holdout_spec(HOLDOUT_KEEPS[split])
        stream = ShardedStream(
            source,
            self._processor,
            rank=rank,
            world_size=world,
            shuffle=train and self.shuffle,
            seed=self.seed,
            buffer_size=self.shuffle_buffer_size,
            length_buffer=length_buffer,
            holdout=holdout,
            length=self._stream_length(source, holdout),
            top_up=train,
            split=split,
            name=self._source_name(split),
        )
        if train:
            # here, before the workers copy it: each shard's rows counted once
            stream.plan_readers(self.num_workers, batch, self.drop_last)
            if stream.length is not None:
                check_fits_one_batch(stream.per_reader(self.num_workers), batch, self.drop_last)
            self._require_known_epoch(stream.length)
        trainer = getattr(self, "trainer", None)
        # the epoch being trained (Lightning's own counter, moved on after the epoch-end hooks)
        epoch_fn = (lambda: trainer.current_epoch) if trainer is not None else None
        return EpochDataLoader(
            stream,
            seed=self.seed,
            rank=rank,
            epoch_fn=epoch_fn,
            position=self._plain_loop_position() if train else None,
            batch_size=batch,
            collate_fn=collate_fn,
            drop_last=self.drop_last if train else False,
            **self._loader_kwargs(),
        )

    def _require_known_epoch(self, length: int | None) -> None:
        trainer = getattr(self, "trainer", None)
        if length is None and trainer is not None and (trainer.max_steps is None or trainer.max_steps < 0):
            raise ConfigError(
                "the training data is a stream of unknown length, so an epoch has no known number of steps: "
                "set trainer.max_steps"
            )

    @staticmethod
    def _stream_length(source: Any, holdout: Any) -> int | None:
        return len(source) if hasattr(source, "__len__") and holdout is None else None

    def _loader(self, ds: Any, split: str) -> EpochDataLoader:
        train = split == "train"
        batch = self.per_device_train_batch_size if train else self.per_device_eval_batch_size
        collate_fn = self.train_collator if train else self._eval_collate(split)
        if is_stream(ds):
            return self._stream_loader(ds, split, batch, collate_fn)
        world, rank = self._world()
        lengths = None
        if train and self.group_by_length:
            lengths = self._train_lengths = self._lengths(ds)
        drop_last = self.drop_last if train else False
        sampler = ExactDistributedSampler(
            ds,
            num_replicas=world,
            rank=rank,
            shuffle=train and self.shuffle,
            seed=self.seed,
            drop_last=drop_last,
            lengths=lengths,
            group_batch_size=batch * self._accumulation(),
            top_up=train,
        )
        if train:
            check_fits_one_batch(len(sampler), batch, self.drop_last)
        return EpochDataLoader(
            TopUpDataset(ds, placeholder=not train) if sampler.needs_top_up else ds,
            seed=self.seed,
            rank=rank,
            position=self._plain_loop_position() if train else None,
            sampler=sampler,
            batch_size=batch,
            collate_fn=collate_fn,
            drop_last=drop_last,
            **self._loader_kwargs(),
        )

    def _eval_collate(self, split: str) -> Any:
        """The evaluation collator of ``split`` (``validation`` or ``test``); marks placeholder batches for a
        module that handles them (:mod:`~hf_lightning.data.placeholder`)."""
        collator = self.test_collator if split == "test" else self.eval_collator
        if self._binding().handles_placeholder_batches:
            return PlaceholderAwareCollator(collator)
        return collator

    def train_batches_per_epoch(self) -> int | None:
        """``len(self.train_dataloader())`` on this rank, computed without building a loader (to size the LR
        schedule before Lightning builds the one train loader, after a checkpoint's loop state is restored).

        ``None`` for a stream of unknown length. Runs :meth:`setup` when it has not run yet.

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``.
        """
        if self.train_dataset is None:
            self.setup("fit")
        ds, stream = self.train_dataset, is_stream(self.train_dataset)
        n = self._stream_length(ds, self._holdout_spec(False)) if stream else len(ds)
        if stream:
            self._require_known_epoch(n)
        return batches_per_epoch(
            n,
            stream=stream,
            world=self._world()[0],
            batch_size=self.per_device_train_batch_size,
            num_workers=self.num_workers,
            drop_last=self.drop_last,
        )

    def train_dataloader(self) -> Any:
        """This rank's share of the epoch's order, in micro-batches of ``per_device_train_batch_size``
        examples.

        For a module that steps windows (``steps_windows`` bound, :class:`HFLightningModule`): one
        :class:`~hf_lightning.core.batch.Window` of ``gradient_accumulation_steps`` micro-batches per
        optimizer step, with their target counts (:class:`~hf_lightning.data.sampling.WindowLoader`), resumed
        in windows.
        Otherwise micro-batches: wrapped in :class:`~hf_lightning.data.sampling.AccumulationWindowLoader` when
        a ``count_loss_items`` is bound (the window keys above); under a Lightning trainer without one (your
        own LightningModule), in :class:`~hf_lightning.data.sampling.ResumableLoader`, so that a run resumed
        inside an epoch continues it; without a trainer the loader itself (its position: :meth:`state_dict`).

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``;
                ``gradient_accumulation_steps > 1`` for a module on Lightning's automatic optimization.
        """
        if self.train_dataset is None:
            self.setup("fit")
        loader = self._loader(self.train_dataset, "train")
        binding = self._binding()
        count = binding.count_loss_items
        trainer = getattr(self, "trainer", None)
        if binding.steps_windows:
            windows = WindowLoader(
                loader,
                self.gradient_accumulation_steps,
                count,
                max_windows=(lambda: trainer.num_training_batches) if trainer is not None else None,
            )
            self._train_loader = windows if trainer is not None else None
            return windows
        if self.gradient_accumulation_steps > 1:
            raise ConfigError(
                f"data.gradient_accumulation_steps={self.gradient_accumulation_steps} needs a module that "
                "steps accumulation windows (HFLightningModule); a module on Lightning's automatic "
                "optimization accumulates with Trainer(accumulate_grad_batches=N): set that, and "
                "data.gradient_accumulation_steps=1"
            )
        if trainer is None:
            # bound but not fitting (inspect a batch): windows of accumulate_grad_batches=1
            return loader if count is None else AccumulationWindowLoader(loader, 1, count)

        if count is None:
            if trainer.is_global_zero and not self._said_no_count:
                self._said_no_count = True
                warn_no_count(trainer.accumulate_grad_batches, trainer.world_size)
            self._train_loader = ResumableLoader(loader)
            return self._train_loader
        self._count_use = CountUse(
            type(trainer.lightning_module).__name__,
            trainer.accumulate_grad_batches,
            trainer.world_size,
            speaks=trainer.is_global_zero,
        )
        self._train_loader = AccumulationWindowLoader(
            loader,
            trainer.accumulate_grad_batches,
            count,
            max_batches=lambda: trainer.num_training_batches,
        )
        return self._train_loader

    def val_dataloader(self) -> Any:
        """Batches of ``per_device_eval_batch_size`` examples in dataset order, this rank's share without any
        padding or repetition (ranks may differ by one example; a rank with none gets one placeholder batch,
        see :mod:`~hf_lightning.data.placeholder`); ``[]`` without validation data."""
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, "validation")

    def test_dataloader(self) -> Any:
        """Batches of the test data (``test_path``, or the ``test_split_name`` split of ``path``, default
        ``test``) as :meth:`val_dataloader` batches the validation data: dataset order, this rank's share.

        Raises:
            ConfigError: no test data (names ``data.test_path`` and why ``path`` gives none).
        """
        if self.test_dataset is None:
            self.setup("test")
        if self.test_dataset is None:
            raise ConfigError(
                f"trainer.test needs test data, and there is none: {self._no_test_data}. Set data.test_path "
                "(a file, folder or dataset, as data.path), or data.test_split_name to a split of data.path"
            )
        return self._loader(self.test_dataset, "test")

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """A flat ``dict`` batch (every batch of this DataModule) moves in one comprehension.

        Lightning's default walks the batch with ``apply_to_collection``, whose fast path needs a dict of
        tensors only; the window counts (``int``) send every batch down its slow path (ABC ``isinstance``
        checks per value, per micro-batch; docs/benchmarks.md has the timing). Any other batch type keeps
        Lightning's behaviour. Here rather than in the LightningModule: Lightning warns on every fit when both
        define it. A training batch moves on the train loader's resume position
        (:meth:`~hf_lightning.data.sampling.ResumableLoader.handed_out`): Lightning moves it right before its
        step.
        """
        trainer = getattr(self, "trainer", None)
        if self._train_loader is not None and trainer is not None and trainer.training:
            self._train_loader.handed_out()
        kind = type(batch)
        if kind is Window:
            return batch  # the module moves each micro-batch as it computes it
        if kind is not dict and kind is not WindowBatch:
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if self._count_use is not None:
            self._count_use.handed_out(batch)  # the previous training batch's step has run by now
        moved = to_device(batch, device)
        return moved if kind is dict else WindowBatch(moved)

    def teardown(self, stage: str) -> None:
        """At the end of ``fit``: say whether the module read the window count, if no second training batch
        did (:class:`~hf_lightning.data.sampling.CountUse`)."""
        if stage == "fit" and self._count_use is not None:
            self._count_use.finish()

    def predict_dataloader(self) -> Any:
        """The validation data in dataset order (each rank its share, no padding)."""
        return self.val_dataloader()
