"""Which background cells of a canvas are enclosed: no 4-connected path of background cells joins
them to the grid's edge (the holes a fill rule fills). The agents mark them in each cell's
embedding (agents/cells.py).

Computed in numpy where a batch is built and carried in it (`input_enclosed`;
docs/gpu.md): the loop's length depends on the data, so on a GPU it would read the device every
round, and no CUDA graph, torch.compile or vmap could trace it; in numpy a round costs microseconds
(torch's small CPU operations several times that).
"""

from __future__ import annotations

import numpy as np
import torch

from data.arc import NUM_COLOURS
from data.canvas import grid_extent


def enclosed_background(canvas: np.ndarray, h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """canvas [B, S, S] int64, its grids' far edges h, w [B] int64 (data.canvas.grid_extent) ->
    [B, S, S] bool: the background cells of each grid that no 4-connected path of background
    cells joins to its edge (the holes a fill rule fills: data.synthetic._fill_enclosed)."""
    side = canvas.shape[-1]
    idx = np.arange(side)
    rows, cols = idx[None, :, None], idx[None, None, :]
    in_grid = (rows < h[:, None, None]) & (cols < w[:, None, None])
    background = (canvas == 0) & in_grid
    # the grid's edge: beside a cell outside it (PAD or a marker) or on the canvas border
    off_grid = np.pad((canvas >= NUM_COLOURS) | ~in_grid, ((0, 0), (1, 1), (1, 1)), constant_values=True)
    edge = off_grid[:, :-2, 1:-1] | off_grid[:, 2:, 1:-1] | off_grid[:, 1:-1, :-2] | off_grid[:, 1:-1, 2:]
    outside = background & edge
    while True:  # grow `outside` through background cells, one step in each direction a round
        grown = outside.copy()
        grown[:, 1:] |= outside[:, :-1]
        grown[:, :-1] |= outside[:, 1:]
        grown[:, :, 1:] |= outside[:, :, :-1]
        grown[:, :, :-1] |= outside[:, :, 1:]
        grown &= background
        if np.array_equal(grown, outside):
            return background & ~outside
        outside = grown


def enclosed_map(canvas: torch.Tensor) -> torch.Tensor:
    """canvas [..., S, S] int64 on any device (a batch's [B, S, S])
    -> [..., S, S] bool on the same device: each canvas's `enclosed_background`, computed on the host."""
    host = canvas.cpu().reshape(-1, *canvas.shape[-2:])  # one copy from a GPU, then everything on the host
    h, w = (x.numpy() for x in grid_extent(host))
    return torch.from_numpy(enclosed_background(host.numpy(), h, w)).view(canvas.shape).to(canvas.device)
