"""Which background cells of a canvas are enclosed: no 4-connected path of background cells joins
them to the grid's edge (the holes a fill rule fills). The agents mark them in each cell's
embedding (agents/cells.py).

Computed where a batch is built (`data.episodes.collate`, on the host, in the loader's workers when
there are any) and carried in the batch beside its canvas (`input_enclosed`, `context_enclosed`):
the flood fill loops until nothing changes, and on a GPU every test of "nothing changed" waits for
the device, several times a forward. An agent given no map computes it itself (a direct call, a
test); a training step never does (tests/test_host_syncs.py counts each call as a host read).
"""

from __future__ import annotations

import torch
from torch import nn

from data.arc import NUM_COLOURS
from data.canvas import grid_extent


# A custom op, not a plain function: its flood fill loops until a fixed point, control flow that
# depends on the data, which neither torch.compile (a graph break) nor vmap (no batching rule for
# the loop's test; tasks adapted together, evaluation/task_batch.py) can trace. As an op it is
# opaque to both: compile sees its output's shape (register_fake), vmap folds the task axis into
# the op's own batch (register_vmap), and it runs eagerly on whole tensors. Tagged unsafe for CUDA
# graphs (its loop reads the device): under --compile_mode reduce-overhead inductor leaves it out of
# the captured graphs.
@torch.library.custom_op("arc::enclosed_background", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def enclosed_background(canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """canvas [B, S, S] int64, its grids' far edges h, w [B] int64 (data.canvas.grid_extent) ->
    [B, S, S] bool: the background cells of each grid that no 4-connected path of background
    cells joins to its edge (the holes a fill rule fills: data.synthetic._fill_enclosed)."""
    side = canvas.shape[-1]
    idx = torch.arange(side, device=canvas.device)
    rows, cols = idx[None, :, None], idx[None, None, :]
    H, W = h[:, None, None], w[:, None, None]
    background = (canvas == 0) & (rows < H) & (cols < W)
    # the grid's edge: beside a cell outside it (PAD or a marker) or on the canvas border, so a grid
    # placed away from the top-left (data/canvas.Placement) has the same edge as at the top-left
    off_grid = nn.functional.pad((canvas >= NUM_COLOURS) | (rows >= H) | (cols >= W), (1, 1, 1, 1), value=True)
    edge = off_grid[:, :-2, 1:-1] | off_grid[:, 2:, 1:-1] | off_grid[:, 1:-1, :-2] | off_grid[:, 1:-1, 2:]
    outside = background & edge
    while True:  # grow `outside` through background cells, one step in each direction a round
        before = outside
        for _ in range(8):  # rounds past the fixed point change nothing; checking every 8th syncs a GPU less
            grown = outside.clone()
            grown[:, 1:] |= outside[:, :-1]
            grown[:, :-1] |= outside[:, 1:]
            grown[:, :, 1:] |= outside[:, :, :-1]
            grown[:, :, :-1] |= outside[:, :, 1:]
            outside = grown & background
        if torch.equal(before, outside):
            return background & ~outside


@enclosed_background.register_fake
def _enclosed_background_shape(canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(canvas, dtype=torch.bool)


@enclosed_background.register_vmap
def _enclosed_background_batched(info, in_dims: tuple, canvas: torch.Tensor, h: torch.Tensor,
                                 w: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Under vmap: the mapped axis (first on output) folded into the batch, one flood fill for all."""
    def leading(x: torch.Tensor, dim: int | None) -> torch.Tensor:
        return x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)
    canvas, h, w = (leading(x, d) for x, d in zip((canvas, h, w), in_dims, strict=True))
    out = enclosed_background(canvas.flatten(0, 1), h.flatten(0, 1), w.flatten(0, 1))
    return out.unflatten(0, (info.batch_size, -1)), 0


def enclosed_map(canvas: torch.Tensor) -> torch.Tensor:
    """canvas [B, S, S] int64 -> [B, S, S] bool: `enclosed_background` of each canvas's grid."""
    return enclosed_background(canvas, *grid_extent(canvas))
