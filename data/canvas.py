"""A grid on a fixed 30x30 canvas, so the agent predicts the output size instead of assuming it.

Classes: 0-9 are ARC colours, PAD fills the canvas outside the grid, EOG (end of grid) marks the
column just right of the grid and the row just below it:

    grid 2x3 ->   c c c E P ...
                  c c c E P ...
                  E E E E P ...
                  P P P P P ...

The height is the index of the first EOG in column 0 (the canvas side if none), the width the index
of the first EOG in row 0.

A batch is cut to the top-left S x S of the canvas (`fit_side`), S just large enough for its grids
and markers: ARC grids are mostly small, and the agents' cost grows with the number of cells (a
3-10 grid needs S = 11, 7x fewer cells than 30x30). Cells beyond S are PAD in both the input and
the target, which the loss excludes, so cutting them changes what the agent sees around the grid,
not what it is trained on. At evaluation the output is unknown, so S is predicted from the demos
and the query input (`expected_side`); training uses the same rule, widened where the target needs it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data.arc import MAX_SIDE, NUM_COLOURS, ArcPair, Grid

PAD = NUM_COLOURS  # 10
EOG = NUM_COLOURS + 1  # 11
NUM_CLASSES = NUM_COLOURS + 2  # 12


def encode(grid: Grid) -> np.ndarray:
    """Grid [h, w] int64 -> canvas [30, 30] int64 with PAD and EOG markers."""
    h, w = grid.shape
    canvas = np.full((MAX_SIDE, MAX_SIDE), PAD, dtype=np.int64)
    canvas[:h, :w] = grid
    if w < MAX_SIDE:
        canvas[: min(h + 1, MAX_SIDE), w] = EOG
    if h < MAX_SIDE:
        canvas[h, : min(w + 1, MAX_SIDE)] = EOG
    return canvas


def fit_side(*shapes: tuple[int, ...]) -> int:
    """The smallest canvas side holding grids of these shapes with their end-of-grid markers (<= 30)."""
    return min(MAX_SIDE, 1 + max(max(shape) for shape in shapes))


def expected_side(demos: tuple[ArcPair, ...], query_input: Grid) -> int:
    """Canvas side for a query whose output is unknown, from the demos and the query input only:
    it fits every demo grid, the query input, and the query input grown by the largest output/input
    ratio the demos show along each axis (at most 30). Invariant under dihedral and colour
    augmentation and demo order, so it is computed once per episode."""
    shapes = [query_input.shape, *(g.shape for d in demos for g in (d.input, d.output))]
    if demos:
        for axis in (0, 1):
            ratio = max(d.output.shape[axis] / d.input.shape[axis] for d in demos)
            shapes.append((math.ceil(query_input.shape[axis] * ratio - 1e-9),))
    return fit_side(*shapes)


def _first(line: np.ndarray, value: int) -> int:
    hits = np.flatnonzero(line == value)
    return int(hits[0]) if hits.size else len(line)


def grid_extent(canvas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """canvas [B, S, S] int64 -> (h, w) [B] int64, read from the end-of-grid markers (S if none)."""
    def first(line: torch.Tensor) -> torch.Tensor:
        hit = line == EOG
        return torch.where(hit.any(1), hit.int().argmax(1), torch.full_like(hit[:, 0], line.shape[1], dtype=torch.long))
    return first(canvas[:, :, 0]), first(canvas[:, 0, :])


def decode(canvas: np.ndarray) -> Grid:
    """Canvas [S, S] int64 -> grid [h, w] int64; the exact inverse of `encode` (cut to any S that
    holds the grid and its markers).

    Size is read from the EOG markers; cells inside the grid that are not colours (a malformed
    prediction) are kept as they are, so they can never match a target colour.
    """
    h, w = _first(canvas[:, 0], EOG), _first(canvas[0, :], EOG)
    return canvas[: max(h, 1), : max(w, 1)].copy()


def decode_prediction(full: np.ndarray, colours: np.ndarray) -> Grid:
    """Argmax over all classes [S, S] and over the 10 colours only [S, S] -> grid [h, w] int64.

    The size comes from the end-of-grid markers of `full`; the cells from `colours`, so every cell
    of a decoded prediction is a valid colour.
    """
    h, w = _first(full[:, 0], EOG), _first(full[0, :], EOG)
    return colours[: max(h, 1), : max(w, 1)].astype(np.int64)


def decode_logits(logits: torch.Tensor) -> Grid:
    """Logits [S, S, C] (any float dtype) -> predicted grid [h, w] int64 (see decode_prediction)."""
    return decode_prediction(logits.argmax(-1).cpu().numpy(), logits[..., :NUM_COLOURS].argmax(-1).cpu().numpy())
