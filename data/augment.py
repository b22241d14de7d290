"""Reversible task augmentation: 8 dihedral transforms x colour permutations x demo order.

One `Augmentation` is applied consistently to every grid of a task, and `invert_grid` maps a
prediction made on the augmented task back to the original frame before it is scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from data.arc import NUM_COLOURS, ArcPair, ArcTask, Grid

IDENTITY_PERM = tuple(range(NUM_COLOURS))
AUGMENTATIONS_KEPT = 1 << 16
VIEW_ID_BASE = 1_000_003  # ids of the fixed evaluation views after the identity


def view_ids(k: int) -> list[int]:
    """k fixed augmentation ids, the identity first: the views evaluation votes over and per-task
    adaptation trains on (fixed, so every validation sees the same views and a frozen Qwen's cache
    holds them)."""
    return [0] + [VIEW_ID_BASE + j for j in range(k - 1)]


def dihedral(grid: Grid, k: int) -> Grid:
    """The k-th of the 8 dihedral transforms: k % 4 quarter turns, then a transpose if k >= 4."""
    out = np.rot90(grid, k % 4)
    return np.ascontiguousarray(out.T if k >= 4 else out)


def dihedral_inverse(grid: Grid, k: int) -> Grid:
    out = grid.T if k >= 4 else grid
    return np.ascontiguousarray(np.rot90(out, -(k % 4)))


@dataclass(frozen=True)
class Augmentation:
    """`dihedral` in 0..7; `colours[c]` is the new colour of colour c; demo `demo_order[j]` is the
    original demo shown at position j. `aug_id` names it (see `from_id`)."""

    dihedral: int = 0
    colours: tuple[int, ...] = IDENTITY_PERM
    demo_order: tuple[int, ...] | None = None
    aug_id: int = 0

    @classmethod
    @lru_cache(maxsize=AUGMENTATIONS_KEPT)
    def from_id(cls, aug_id: int, n_demos: int) -> Augmentation:
        """0 is the identity, 1-7 the other dihedral transforms alone, and any id >= 8 a uniformly
        drawn dihedral x colour permutation x demo order, reproducible from the id. Colour 0, the
        background of most ARC tasks, stays 0 (permuted with the others it tied: docs/results.md,
        "Colour 0 permuted with the others"), so a view's features are its dihedral's, recoloured.
        The last AUGMENTATIONS_KEPT are kept (frozen, so shared): drawing one costs more than
        applying it."""
        if aug_id < 0:
            raise ValueError(f"augmentation id must be >= 0, got {aug_id}")
        if aug_id < 8:
            return cls(dihedral=aug_id, aug_id=aug_id)
        rng = np.random.default_rng(aug_id)
        k = int(rng.integers(8))
        colours = (0, *(int(c) + 1 for c in rng.permutation(NUM_COLOURS - 1)))
        return cls(k, colours, tuple(int(i) for i in rng.permutation(n_demos)), aug_id)

    @property
    def is_identity(self) -> bool:
        order_id = self.demo_order is None or self.demo_order == tuple(range(len(self.demo_order)))
        return self.dihedral == 0 and self.colours == IDENTITY_PERM and order_id

    def grid(self, grid: Grid) -> Grid:
        return np.asarray(self.colours, dtype=np.int64)[dihedral(grid, self.dihedral)]

    def invert_grid(self, grid: Grid) -> Grid:
        inverse = np.argsort(np.asarray(self.colours, dtype=np.int64))
        return dihedral_inverse(inverse[grid], self.dihedral)

    def pairs(self, pairs: tuple[ArcPair, ...]) -> tuple[ArcPair, ...]:
        """Transform every grid, then reorder (the order applies to demos: pass test pairs to
        `grids_only`)."""
        out = self.grids_only(pairs)
        return tuple(out[i] for i in self.demo_order) if self.demo_order is not None else out

    def grids_only(self, pairs: tuple[ArcPair, ...]) -> tuple[ArcPair, ...]:
        return tuple(ArcPair(self.grid(p.input), self.grid(p.output)) for p in pairs)

    def task(self, task: ArcTask) -> ArcTask:
        """The whole task under this augmentation: every grid transformed, the demos reordered."""
        return ArcTask(task.task_id, self.pairs(task.train), self.grids_only(task.test))
