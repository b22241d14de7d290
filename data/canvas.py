"""A grid on a canvas, so the agent predicts the output size instead of assuming it.

Classes: 0-9 are ARC colours, PAD fills the canvas outside the grid, EOG (end of grid) marks the
column just right of the grid and the row just below it:

    grid 2x3 ->   c c c E P ...
                  c c c E P ...
                  E E E E P ...
                  P P P P P ...

The height is the index of the first EOG in the grid's first column (the canvas side if none), the
width the index of the first EOG in its first row. Batches are cut to the side S their grids need
(`fit_side`, `expected_extent`): docs/model.md, "Canvas". Cells beyond S are PAD in input and
target, which the loss excludes: a cut changes what the agent sees, not what it is trained on.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data.arc import MAX_SIDE, NUM_COLOURS, ArcPair, Grid

PAD = NUM_COLOURS  # 10
EOG = NUM_COLOURS + 1  # 11
NUM_CLASSES = NUM_COLOURS + 2  # 12


def encode(grid: Grid, side: int = MAX_SIDE) -> np.ndarray:
    """Grid [h, w] int64 -> canvas [side, side] int64 with PAD and EOG markers, the grid at the
    top-left (ValueError when it does not fit)."""
    h, w = grid.shape
    if h > side or w > side:
        raise ValueError(f"a {h}x{w} grid does not fit a {side}x{side} canvas")
    canvas = np.full((side, side), PAD, dtype=np.int64)
    canvas[:h, :w] = grid
    if w < side:
        canvas[: min(h + 1, side), w] = EOG
    if h < side:
        canvas[h, : min(w + 1, side)] = EOG
    return canvas


def fit_side(*shapes: tuple[int, ...]) -> int:
    """The smallest canvas side holding grids of these shapes with their end-of-grid markers (<= 30)."""
    return min(MAX_SIDE, 1 + max(max(shape) for shape in shapes))


def expected_extent(demos: tuple[ArcPair, ...], query_input: Grid) -> int:
    """The largest grid side (<= 30) of an episode whose query output is unknown, from the demos and
    the query input only: every demo grid, the query input, and the query input grown by the largest
    output/input ratio the demos show along each axis. Invariant under dihedral and colour
    augmentation and demo order, so it is computed once per episode."""
    sides = [*query_input.shape, *(n for d in demos for g in (d.input, d.output) for n in g.shape)]
    if demos:
        for axis in (0, 1):
            ratio = max(d.output.shape[axis] / d.input.shape[axis] for d in demos)
            sides.append(math.ceil(query_input.shape[axis] * ratio - 1e-9))
    return min(MAX_SIDE, max(sides))


def _first(line: np.ndarray, value: int) -> int:
    hits = np.flatnonzero(line == value)
    return int(hits[0]) if hits.size else len(line)


def grid_extent(canvas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """canvas [B, S, S] int64 -> (bottom, right) [B] int64: the row of the end-of-grid marker below
    the grid and the column of the one right of it (S if none), read along the grid's first column
    and row (the first holding a cell that is not PAD). For a grid at the top-left: its height and width."""
    def first(hit: torch.Tensor) -> torch.Tensor:  # [B, S] bool -> index of the first True (S if none)
        return torch.where(hit.any(1), hit.int().argmax(1), torch.full_like(hit[:, 0], hit.shape[1], dtype=torch.long))
    grid = canvas != PAD
    top, left = first(grid.any(2)).clamp(max=canvas.shape[1] - 1), first(grid.any(1)).clamp(max=canvas.shape[2] - 1)
    column = canvas.gather(2, left[:, None, None].expand(-1, canvas.shape[1], 1))[..., 0]  # [B, S]
    row = canvas.gather(1, top[:, None, None].expand(-1, 1, canvas.shape[2]))[:, 0]
    return first(column == EOG), first(row == EOG)


def decode(canvas: np.ndarray) -> Grid:
    """Canvas [S, S] int64 -> grid [h, w] int64; the exact inverse of `encode` (cut to any S that
    holds the grid and its markers).

    Size is read from the EOG markers; cells inside the grid that are not colours (a malformed
    prediction) are kept as they are, so they can never match a target colour.
    """
    h, w = _first(canvas[:, 0], EOG), _first(canvas[0], EOG)
    return canvas[: max(h, 1), : max(w, 1)].copy()


def decode_logp(logp: np.ndarray) -> tuple[Grid, float]:
    """One view's log-softmax over all classes [S, S, 12] float32 -> (predicted grid [h, w] int64, its
    mean colour log-probability a cell, float).

    The size comes from the end-of-grid markers of the argmax over all classes, read from the
    top-left (at least one cell); each cell is the argmax over the 10 colours (the colour
    log-softmax), so every cell of a decoded prediction is a valid colour.
    """
    full = logp.argmax(-1)
    h, w = max(1, _first(full[:, 0], EOG)), max(1, _first(full[0], EOG))
    colour = logp[:h, :w, :NUM_COLOURS]
    peak = colour.max(-1, keepdims=True)  # log-softmax over the colours alone, stably
    colour = colour - (peak + np.log(np.exp(colour - peak).sum(-1, keepdims=True)))
    return colour.argmax(-1).astype(np.int64), float(colour.max(-1).mean())


def decode_logits(logits: torch.Tensor) -> Grid:
    """Logits [S, S, C] (any float dtype) -> predicted grid [h, w] int64 (see decode_logp)."""
    return decode_logp(torch.log_softmax(logits.float(), -1).cpu().numpy())[0]


def one_hot(classes: torch.Tensor, num_classes: int = NUM_CLASSES) -> torch.Tensor:
    """classes [...] int64 in [0, num_classes) -> [..., num_classes] float32. A comparison, not
    F.one_hot: that checks the range on the host (a synchronization on a GPU) and so cannot run
    under vmap (tasks adapted together, evaluation/task_batch.py)."""
    return (classes.unsqueeze(-1) == torch.arange(num_classes, device=classes.device)).float()
