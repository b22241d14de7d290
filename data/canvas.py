"""A grid on a fixed 30x30 canvas, so the agent predicts the output size instead of assuming it.

Classes: 0-9 are ARC colours, PAD fills the canvas outside the grid, EOG (end of grid) marks the
column just right of the grid and the row just below it:

    grid 2x3 ->   c c c E P ...
                  c c c E P ...
                  E E E E P ...
                  P P P P P ...

The height is the index of the first EOG in column 0 (30 if none), the width the index of the first
EOG in row 0 (30 if none).
"""

from __future__ import annotations

import numpy as np
import torch

from data.arc import MAX_SIDE, NUM_COLOURS, Grid

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


def _first(line: np.ndarray, value: int) -> int:
    hits = np.flatnonzero(line == value)
    return int(hits[0]) if hits.size else MAX_SIDE


def decode(canvas: np.ndarray) -> Grid:
    """Canvas [30, 30] int64 -> grid [h, w] int64; the exact inverse of `encode`.

    Size is read from the EOG markers; cells inside the grid that are not colours (a malformed
    prediction) are kept as they are, so they can never match a target colour.
    """
    h, w = _first(canvas[:, 0], EOG), _first(canvas[0, :], EOG)
    return canvas[: max(h, 1), : max(w, 1)].copy()


def decode_prediction(full: np.ndarray, colours: np.ndarray) -> Grid:
    """Argmax over all classes [30, 30] and over the 10 colours only [30, 30] -> grid [h, w] int64.

    The size comes from the end-of-grid markers of `full`; the cells from `colours`, so every cell
    of a decoded prediction is a valid colour.
    """
    h, w = _first(full[:, 0], EOG), _first(full[0, :], EOG)
    return colours[: max(h, 1), : max(w, 1)].astype(np.int64)


def decode_logits(logits: torch.Tensor) -> Grid:
    """Logits [30, 30, C] (any float dtype) -> predicted grid [h, w] int64 (see decode_prediction)."""
    return decode_prediction(logits.argmax(-1).cpu().numpy(), logits[..., :NUM_COLOURS].argmax(-1).cpu().numpy())
