"""Curriculum batches: a fixed share of easy episodes per batch, higher in the first epoch.

Batches are a pure function of (seed, epoch), so a run resumed mid-epoch draws exactly the batches
it would have drawn, and each entry carries the id of its own augmentation so results do not
depend on the number of loader workers.
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

    def __init__(self, is_easy: np.ndarray, batch_size: int, seed: int, augment: bool,
                 warmup_fraction: float, later_fraction: float, augment_pool: int = 0,
                 task_of: np.ndarray | None = None):
        self.easy = np.flatnonzero(is_easy)
        self.hard = np.flatnonzero(~is_easy)
        self.batch_size, self.seed, self.augment = batch_size, seed, augment
        self.fractions = (warmup_fraction, later_fraction)
        self.epoch, self.start_batch = 0, 0
        self.augment_pool = augment_pool
        self.task_of = task_of if task_of is not None else np.arange(len(is_easy))

    def augmentation_id(self, episode: int, rng: np.random.Generator) -> int:
        """A fresh id >= 8, or with a pool, one of the `augment_pool` ids fixed for this episode's
        task: then all episodes of a task share augmented demos, and a frozen encoder's cache
        covers every augmentation the run will ever draw."""
        if not self.augment:
            return 0
        if self.augment_pool <= 0:
            return int(rng.integers(8, 2**31 - 1))
        slot = int(rng.integers(self.augment_pool))
        return int(np.random.default_rng([self.seed, int(self.task_of[episode]), slot]).integers(8, 2**31 - 1))

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
        batches = []
        for _ in range(self.batches_per_epoch):
            n_easy = int(rng.binomial(self.batch_size, frac))
            picks = []
            for pool_id, count in ((0, n_easy), (1, self.batch_size - n_easy)):
                pool = pools[pool_id] if len(pools[pool_id]) else pools[1 - pool_id]
                for _ in range(count):
                    picks.append(int(pool[cursors[pool_id] % len(pool)]))
                    cursors[pool_id] += 1
            batches.append([(i, self.augmentation_id(i, rng)) for i in picks])
        return batches

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        yield from self.epoch_batches()[self.start_batch:]
