"""Candidates beyond each view's argmax: the most probable grids of a shape under the views together.

Each view's log-softmax is mapped back to the task's frame as a per-cell colour table [H, W, 10] for
one output shape, and the tables of the views are summed (the product of the views as experts:
summed over a grid's cells it is exactly the grid's view-summed log-probability of
`Candidates.view_score`, less the end-of-grid markers, which are the same for every grid of that
shape). The most probable grid of the shape is each cell's best colour; the next ones change the
least certain cells, best first, until `k` grids or a probability floor: the ARChitects'
depth-first sampling with a threshold, here over per-cell distributions, where it is exact and
needs no sampling (a best-first walk over subsets of cell changes ordered by their cost).

A view whose canvas cannot hold the shape gives every grid of it -inf under `view_score`; the
enumeration then reads the views that can.
"""

from __future__ import annotations

import heapq

import numpy as np

from data.arc import Grid
from data.augment import Augmentation, dihedral
from data.canvas import NUM_COLOURS

ALTERNATIVES = 2  # colours a cell may change to: its second and third most probable
MAX_WALK = 64  # popped subsets per enumerated grid at most, so a dense tie of costs stays bounded


def frame_table(aug: Augmentation, logp: np.ndarray, shape: tuple[int, int]) -> np.ndarray | None:
    """One view's colour log-probabilities read in the task's frame.

    aug: the view; logp [S, S, 12] float32: its log-softmax over all classes on its canvas; shape:
    (H, W) of an output grid in the task's frame. -> [H, W, 10] float32, entry [i, j, c]: the view's
    log-probability that cell (i, j) is colour c, summed over the cell's block when the view scales
    it; None when the view's canvas cannot hold the shape where the view places it.
    """
    shown = dihedral(np.zeros(shape, dtype=np.int64), aug.dihedral).shape
    p, side = aug.placement, logp.shape[0]
    if not p.fits(shown, side):
        return None
    s, (h, w) = p.scale, shown
    blocks = logp[p.row: p.row + s * h, p.col: p.col + s * w, :NUM_COLOURS].reshape(h, s, w, s, NUM_COLOURS)
    view = blocks.sum((1, 3))[..., np.asarray(aug.colours)]  # [h, w, c]: colour c of the task is aug.colours[c]
    back = view.transpose(1, 0, 2) if aug.dihedral >= 4 else view  # dihedral_inverse on the first two axes
    return np.ascontiguousarray(np.rot90(back, -(aug.dihedral % 4), axes=(0, 1)))


def summed_table(views: list[tuple[Augmentation, np.ndarray]], shape: tuple[int, int]) -> tuple[np.ndarray, int]:
    """-> (the views' frame tables summed [H, W, 10] float64, how many views could hold the shape)."""
    total, count = np.zeros((*shape, NUM_COLOURS)), 0
    for aug, logp in views:
        table = frame_table(aug, logp, shape)
        if table is not None:
            total += table
            count += 1
    return total, count


def best_grids(table: np.ndarray, k: int, floor: float) -> list[Grid]:
    """The `k` most probable grids under independent cells, best first.

    table [H, W, 10] float: log-probabilities (summed over views); floor: the most a grid may fall
    below the best one, in the same units. -> grids [H, W] int64: the argmax first, then grids that
    change some cells to their next colours (ALTERNATIVES a cell), in order of the log-probability
    they lose. A best-first walk over subsets of the changes sorted by cost: from the subset ending
    at change i, add change i+1 or swap i for it; every subset is reached once, in order of cost,
    and a subset that changes one cell twice is walked through but not proposed.
    """
    h, w, _ = table.shape
    cells = table.reshape(h * w, NUM_COLOURS)
    order = np.argsort(-cells, axis=1, kind="stable")[:, : 1 + ALTERNATIVES]
    best = order[:, 0]
    top = cells[np.arange(h * w), best]
    costs = [(float(top[c] - cells[c, order[c, a]]), c, int(order[c, a]))
             for c in range(h * w) for a in range(1, 1 + ALTERNATIVES)]
    changes = sorted(x for x in costs if x[0] <= floor)
    grids = [best.reshape(h, w).astype(np.int64)]
    if not changes or k <= 1:
        return grids[:k]
    heap = [(changes[0][0], 0, (0,))]
    walked = 0
    while heap and len(grids) < k and walked < MAX_WALK * k:
        cost, last, chosen = heapq.heappop(heap)
        walked += 1
        touched = [changes[i][1] for i in chosen]
        if len(set(touched)) == len(touched):
            grid = best.copy()
            for i in chosen:
                grid[changes[i][1]] = changes[i][2]
            grids.append(grid.reshape(h, w).astype(np.int64))
        if last + 1 < len(changes):
            step = changes[last + 1][0]
            for nxt in ((cost + step, last + 1, (*chosen, last + 1)),
                        (cost - changes[last][0] + step, last + 1, (*chosen[:-1], last + 1))):
                if nxt[0] <= floor:
                    heapq.heappush(heap, nxt)
    return grids


def enumerate_grids(views: list[tuple[Augmentation, np.ndarray]], shapes: list[tuple[int, int]], k: int,
                    floor: float) -> list[Grid]:
    """Up to `k` grids of each shape in `shapes`, best first (`best_grids` over the views' summed
    table); `floor` in nats a view (a grid may fall `floor * views` below its shape's best)."""
    out: list[Grid] = []
    for shape in shapes:
        table, count = summed_table(views, shape)
        if count:
            out += best_grids(table, k, floor * count)
    return out
