"""Curriculum batches: a fixed share of easy episodes per batch, higher in the first epoch.

With `sides` and `bucket` > 1, each run of `bucket` batches is re-dealt by canvas side, the batches
then in a random order (`--size_buckets`, docs/model.md "Canvas"). Batches are a pure function of
(seed, epoch), so a run resumed mid-epoch draws exactly the batches it would have drawn, and each
entry carries the id of its own augmentation so results do not depend on the number of loader workers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

EASY_PERCENTILE = 30.0  # episodes below this difficulty percentile are "easy"


def easy_fraction(epoch: int, warmup_fraction: float = 0.6, later_fraction: float = 0.3) -> float:
    """Share of easy episodes in a batch: `warmup_fraction` while epoch < 1, `later_fraction` after."""
    return warmup_fraction if epoch < 1 else later_fraction


class CurriculumBatches:
    """Batch sampler over episodes: yields lists of (episode index, augmentation id).

    The augmentation id is 0 (the identity) when augmentation is off. Within an epoch the easy and the hard
    pools are each walked in a fresh random order, so every episode is seen before any repeats.
    """

    def __init__(self, *, is_easy: np.ndarray, batch_size: int, seed: int, augment: bool, warmup_fraction: float,
                 later_fraction: float, augment_pool: int = 0, task_of: np.ndarray | None = None, rank: int = 0,
                 world_size: int = 1, sides: np.ndarray | None = None, bucket: int = 0):
        self.easy = np.flatnonzero(is_easy)
        self.hard = np.flatnonzero(~is_easy)
        # With several processes each draws its slice of one global batch of batch_size x world_size,
        # so the run sees what one process with the larger batch would see.
        self.local_batch, self.rank = batch_size, rank
        self.batch_size, self.seed, self.augment = batch_size * world_size, seed, augment
        self.fractions = (warmup_fraction, later_fraction)
        self.epoch, self.start_batch = 0, 0
        self.augment_pool = augment_pool
        self.task_of = task_of if task_of is not None else np.arange(len(is_easy))
        self.sides, self.bucket = sides, bucket
        self._pool_ids: dict[tuple[int, int], int] = {}

    def augmentation_ids(self, rng: np.random.Generator) -> np.ndarray:
        """This epoch's augmentation id per episode: 0 without augmentation; a fresh id >= 8 per
        episode without a pool; with a pool, one of the task's `augment_pool` fixed ids, the same for
        every episode of the task this epoch, so leave-one-out episodes share augmented demos (and
        their cached encodings) and a frozen encoder's cache covers every id the run will draw."""
        n = len(self.task_of)
        if not self.augment:
            return np.zeros(n, dtype=np.int64)
        if self.augment_pool <= 0:
            return rng.integers(8, 2**31 - 1, size=n)
        slots = rng.integers(self.augment_pool, size=int(self.task_of.max()) + 1)
        per_task = np.array([self.pool_id(t, int(slot)) for t, slot in enumerate(slots)], dtype=np.int64)
        return per_task[self.task_of]

    def pool_id(self, task: int, slot: int) -> int:
        """The augmentation id in `slot` of the task's pool: a pure function of (seed, task, slot),
        kept once drawn (a generator costs more than the rest of an epoch's sampling)."""
        key = (task, slot)
        if key not in self._pool_ids:
            self._pool_ids[key] = int(np.random.default_rng([self.seed, task, slot]).integers(8, 2**31 - 1))
        return self._pool_ids[key]

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil((len(self.easy) + len(self.hard)) / self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def epoch_batches(self) -> list[list[tuple[int, int]]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        pools = [rng.permutation(self.easy), rng.permutation(self.hard)]
        cursors = [0, 0]
        frac = easy_fraction(self.epoch, *self.fractions)
        aug_ids = self.augmentation_ids(rng)
        picks = []  # per batch: (easy episodes, hard episodes)
        for _ in range(self.batches_per_epoch):
            n_easy = int(rng.binomial(self.batch_size, frac))
            batch = ([], [])
            for pool_id, count in ((0, n_easy), (1, self.batch_size - n_easy)):
                pool = pools[pool_id] if len(pools[pool_id]) else pools[1 - pool_id]
                for _ in range(count):
                    batch[pool_id].append(int(pool[cursors[pool_id] % len(pool)]))
                    cursors[pool_id] += 1
            picks.append(batch)
        if self.sides is not None and self.bucket > 1:
            picks = self.bucketed(picks, np.random.default_rng([self.seed, self.epoch, 1]))
        return [[(i, int(aug_ids[i])) for i in easy + hard] for easy, hard in picks]

    def bucketed(self, picks: list[tuple[list[int], list[int]]], rng: np.random.Generator):
        """Re-deal each run of `bucket` batches by canvas side, keeping every batch's easy/hard counts."""
        out = []
        for lo in range(0, len(picks), self.bucket):
            run = picks[lo:lo + self.bucket]
            dealt: list[tuple[list[int], list[int]]] = [([], []) for _ in run]
            for pool_id in (0, 1):
                by_side = sorted((i for batch in run for i in batch[pool_id]), key=lambda i: self.sides[i])
                at = 0
                for batch, new in zip(run, dealt, strict=True):
                    new[pool_id].extend(by_side[at:at + len(batch[pool_id])])
                    at += len(batch[pool_id])
            out.extend(dealt[j] for j in rng.permutation(len(dealt)))
        return out

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        lo = self.rank * self.local_batch
        for batch in self.epoch_batches()[self.start_batch:]:
            yield batch[lo:lo + self.local_batch]
