"""Reversible task augmentation: 8 dihedral transforms x colour permutations x demo order.

One `Augmentation` is applied consistently to every grid of a task, and `invert_grid` maps a
prediction made on the augmented task back to the original frame before it is scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.arc import NUM_COLOURS, ArcPair, ArcTask, Grid

IDENTITY_PERM = tuple(range(NUM_COLOURS))


def dihedral(grid: Grid, k: int) -> Grid:
    """The k-th of the 8 dihedral transforms: k % 4 quarter turns, then a transpose if k >= 4."""
    out = np.rot90(grid, k % 4)
    return np.ascontiguousarray(out.T if k >= 4 else out)


def dihedral_inverse(grid: Grid, k: int) -> Grid:
    out = grid.T if k >= 4 else grid
    return np.ascontiguousarray(np.rot90(out, -(k % 4)))


@dataclass(frozen=True)
class Augmentation:
    """`dihedral` in 0..7; `colours[c]` is the new colour of colour c; `demo_order` permutes demos."""

    dihedral: int = 0
    colours: tuple[int, ...] = IDENTITY_PERM
    demo_order: tuple[int, ...] | None = None

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
        out = [ArcPair(self.grid(p.input), self.grid(p.output)) for p in pairs]
        if self.demo_order is not None:
            out = [out[i] for i in self.demo_order]
        return tuple(out)

    def task(self, task: ArcTask) -> ArcTask:
        """The whole task under this augmentation (demo order applies to the demos only)."""
        test = Augmentation(self.dihedral, self.colours).pairs(task.test)
        return ArcTask(task.task_id, self.pairs(task.train), test)


def random_augmentation(rng: np.random.Generator, n_demos: int, permute_background: bool = False) -> Augmentation:
    """A uniformly drawn augmentation; colour 0 (background) stays fixed unless asked otherwise."""
    k = int(rng.integers(8))
    if permute_background:
        colours = tuple(int(c) for c in rng.permutation(NUM_COLOURS))
    else:
        colours = (0, *(int(c) + 1 for c in rng.permutation(NUM_COLOURS - 1)))
    order = tuple(int(i) for i in rng.permutation(n_demos))
    return Augmentation(k, colours, order)
