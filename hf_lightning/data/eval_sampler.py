"""Evaluation sharding without padding: every example is evaluated exactly once across ranks."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler


class EvalShardSampler(DistributedSampler):
    """Rank ``r`` of ``W`` takes indices ``r, r + W, r + 2W, ...`` in dataset order.

    ``torch.utils.data.DistributedSampler`` pads the last shard by repeating examples so that all ranks
    hold the same count; for evaluation that counts those examples twice (5 examples on 2 ranks give 6
    predictions; HF removes the copies afterwards in ``gather_for_metrics``). Here shards may differ by one
    example and nothing is repeated; metric states are summed across ranks and predictions are put back in
    dataset order by their stride.

    It subclasses ``DistributedSampler`` only so that a ``lightning.Trainer`` left at
    ``use_distributed_sampler=True`` sees a loader that is already sharded and does not wrap it again
    (Lightning re-shards any other sampler, which would split these shards a second time).

    Args:
        num_examples: dataset length.
        num_replicas: world size (>= 1).
        rank: this process's rank in ``[0, num_replicas)``.
    """

    def __init__(self, num_examples: int, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside [0, {num_replicas})")
        super().__init__(range(num_examples), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_examples = num_examples
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.num_examples, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.num_examples, self.num_replicas))
