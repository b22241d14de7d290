"""A grid on a canvas, so the agent predicts the output size instead of assuming it.

Classes: 0-9 are ARC colours, PAD fills the canvas outside the grid, EOG (end of grid) marks the
column just right of the grid and the row just below it:

    grid 2x3 ->   c c c E P ...
                  c c c E P ...
                  E E E E P ...
                  P P P P P ...

The height is the index of the first EOG in the grid's first column (the canvas side if none), the
width the index of the first EOG in its first row. Placements, and batches cut to the side S
their grids need (`fit_side`, `expected_extent`): docs/model.md, "Canvas" and "Scale-and-translate
canvases". Cells beyond S are PAD in input and target, which the loss excludes: a cut changes what
the agent sees, not what it is trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from data.arc import MAX_SIDE, NUM_COLOURS, ArcPair, Grid

PAD = NUM_COLOURS  # 10
EOG = NUM_COLOURS + 1  # 11
NUM_CLASSES = NUM_COLOURS + 2  # 12


@dataclass(frozen=True)
class Placement:
    """Where an episode's grids sit on the canvas: each cell drawn as a `scale` x `scale` block, the
    grid's top-left cell at (`row`, `col`). The default is the top-left grid, one cell a cell."""

    scale: int = 1
    row: int = 0
    col: int = 0

    @property
    def is_identity(self) -> bool:
        return self == Placement()

    def fits(self, shape: tuple[int, ...], side: int) -> bool:
        """Whether a grid of `shape` placed so lies on a `side`-cell canvas (its markers may fall off)."""
        return self.row + self.scale * shape[0] <= side and self.col + self.scale * shape[1] <= side

    def side_for(self, extent: int) -> int:
        """The canvas side holding grids of at most `extent` cells a side, placed so, with their markers."""
        return max(self.row, self.col) + self.scale * extent + 1


@dataclass(frozen=True)
class Placing:
    """How views place grids: integer scales up to `max_scale`, offsets up to `max_shift` cells along
    each axis, on canvases of at most `side` cells (>= 30). The default places nothing."""

    side: int = MAX_SIDE
    max_scale: int = 1
    max_shift: int = 0

    def __post_init__(self) -> None:
        if self.side < MAX_SIDE or self.max_scale < 1 or self.max_shift < 0:
            raise ValueError(f"{self}: needs side >= {MAX_SIDE}, max_scale >= 1 and max_shift >= 0")

    @property
    def places(self) -> bool:
        return self.max_scale > 1 or self.max_shift > 0

    def draw(self, aug_id: int, extent: int) -> Placement:
        """The placement of view `aug_id` for an episode whose grids are at most `extent` cells a side
        (its expected output included): a scale drawn among those that fit with the markers, then an
        offset on each axis among those that keep them on the canvas; the identity when none does.
        Reproducible from the id and the extent, so every validation sees the same views."""
        if not self.places or aug_id == 0:
            return Placement()
        rng = np.random.default_rng([aug_id, PLACEMENT_STREAM])
        scales = [s for s in range(2, self.max_scale + 1) if s * extent + 1 <= self.side]
        scale = int(rng.choice([1, *scales]))
        room = max(0, min(self.max_shift, self.side - 1 - scale * extent))
        row, col = (int(x) for x in rng.integers(0, room + 1, size=2))
        return Placement(scale, row, col)


PLACEMENT_STREAM = 0x91ACE  # a view's placement is drawn from its own stream of the view id


def encode(grid: Grid, placement: Placement = Placement(), side: int = MAX_SIDE) -> np.ndarray:
    """Grid [h, w] int64 -> canvas [side, side] int64 with PAD and EOG markers, the grid placed by
    `placement` (ValueError when it does not fit)."""
    h, w = grid.shape
    s, r, c = placement.scale, placement.row, placement.col
    if not placement.fits(grid.shape, side):
        raise ValueError(f"a {h}x{w} grid at {placement} does not fit a {side}x{side} canvas")
    canvas = np.full((side, side), PAD, dtype=np.int64)
    canvas[r: r + s * h, c: c + s * w] = np.repeat(np.repeat(grid, s, 0), s, 1)
    if c + s * w < side:
        canvas[r: min(r + s * h + 1, side), c + s * w] = EOG
    if r + s * h < side:
        canvas[r + s * h, c: min(c + s * w + 1, side)] = EOG
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


def decode(canvas: np.ndarray, placement: Placement = Placement()) -> Grid:
    """Canvas [S, S] int64 -> grid [h, w] int64; the exact inverse of `encode` with the same
    placement (cut to any S that holds the grid and its markers).

    Size is read from the EOG markers; cells inside the grid that are not colours (a malformed
    prediction) are kept as they are, so they can never match a target colour.
    """
    s, r, c = placement.scale, placement.row, placement.col
    h, w = _first(canvas[r:, c], EOG), _first(canvas[r, c:], EOG)
    return canvas[r: r + max(h, s): s, c: c + max(w, s): s].copy()


def decode_logp(logp: np.ndarray, placement: Placement = Placement()) -> tuple[Grid, float]:
    """One view's log-softmax over all classes [S, S, 12] float32 -> (predicted grid [h, w] int64, its
    mean colour log-probability a cell, float).

    The size comes from the end-of-grid markers of the argmax over all classes, read from the
    placement's top-left (the nearest whole number of cells at its scale); each cell is the colour
    most probable over its s x s block (the colour log-softmax summed over the block), so every cell
    of a decoded prediction is a valid colour. Unplaced: the argmax over the 10 colours of each cell.
    """
    side, s, r, c = logp.shape[0], placement.scale, placement.row, placement.col
    full = logp.argmax(-1)
    h = max(1, min(int(_first(full[r:, c], EOG) / s + 0.5), (side - r) // s))
    w = max(1, min(int(_first(full[r, c:], EOG) / s + 0.5), (side - c) // s))
    colour = logp[r: r + s * h, c: c + s * w, :NUM_COLOURS]
    peak = colour.max(-1, keepdims=True)  # log-softmax over the colours alone, stably
    colour = colour - (peak + np.log(np.exp(colour - peak).sum(-1, keepdims=True)))
    blocks = colour.reshape(h, s, w, s, NUM_COLOURS).sum((1, 3))
    return blocks.argmax(-1).astype(np.int64), float(blocks.max(-1).mean() / (s * s))


def decode_logits(logits: torch.Tensor) -> Grid:
    """Logits [S, S, C] (any float dtype) -> predicted grid [h, w] int64 of an unplaced view (see decode_logp)."""
    return decode_logp(torch.log_softmax(logits.float(), -1).cpu().numpy())[0]


def one_hot(classes: torch.Tensor, num_classes: int = NUM_CLASSES) -> torch.Tensor:
    """classes [...] int64 in [0, num_classes) -> [..., num_classes] float32. A comparison, not
    F.one_hot: that checks the range on the host (a synchronization on a GPU) and so cannot run
    under vmap (tasks adapted together, evaluation/task_batch.py)."""
    return (classes.unsqueeze(-1) == torch.arange(num_classes, device=classes.device)).float()
