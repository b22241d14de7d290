"""Geometric views of the input grid, gated by the prompt: a routing prior for every agent (docs/model.md,
"Views": why, the gate, the enclosed-background mark). Each cell is also shown what the input holds
at the matching cell of each view:

    views 0-7   the 8 dihedral transforms of the input grid, in the order of data.augment.dihedral
    views 8-9   the input scaled up 2x and 3x (np.kron)
    views 10-11 the input scaled down 2x and 3x (every 2nd / 3rd cell)
    view 12     the input cut to the bounding box of its non-background cells (crop to content)
    views 13-16 the non-background cells fallen down, up, right, left, in order (gravity)

each as a canvas of its own with its own end-of-grid markers (so a view also proposes an output
size); the cell's viewed class goes into its embedding and through the prompted class map of the
output layer (agents/cells.py). `views=False` turns them off.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from data.arc import NUM_COLOURS, ArcPair
from data.canvas import EOG, NUM_CLASSES, PAD, encode, grid_extent
from data.features import SCALES  # the up- and down-scalings the relation features score

GRAVITY = ((1, 0), (-1, 0), (0, 1), (0, -1))  # views 13-16: the (row, column) direction cells fall in
FIRST_GRAVITY = 8 + 2 * len(SCALES) + 1
NUM_VIEWS = FIRST_GRAVITY + len(GRAVITY)


def _dihedral_matrix(k: int) -> np.ndarray:
    """What data.augment.dihedral(., k) does to a (row, column) displacement [2, 2] int64:
    np.rot90 sends (dr, dc) to (-dc, dr), the transpose swaps the two."""
    turn, swap = np.array([[0, -1], [1, 0]]), np.array([[0, 1], [1, 0]])
    return (swap if k >= 4 else np.eye(2, dtype=np.int64)) @ np.linalg.matrix_power(turn, k % 4)


def _views_in_frames() -> torch.Tensor:
    """[8, NUM_VIEWS] int64: row d maps each view of a task's own frame to the view doing the same in
    the frame of dihedral transform d (the frame an augmented sample is seen in): a dihedral view v
    becomes d v d^-1, a gravity direction u becomes d u; scalings and the crop commute with d."""
    matrices = [_dihedral_matrix(k) for k in range(8)]
    keys = [m.tobytes() for m in matrices]
    rows = []
    for md in matrices:  # orthogonal: its inverse is its transpose
        dihedral = [keys.index((md @ mv @ md.T).tobytes()) for mv in matrices]
        gravity = [FIRST_GRAVITY + GRAVITY.index(tuple(int(x) for x in md @ np.array(u))) for u in GRAVITY]
        rows.append(dihedral + list(range(8, FIRST_GRAVITY)) + gravity)
    return torch.tensor(rows, dtype=torch.int64)


VIEWS_IN_FRAME = _views_in_frames()


@functools.cache
def views_in_frame(device: torch.device) -> torch.Tensor:
    """VIEWS_IN_FRAME on `device`, copied there once (an adapter reads it every forward)."""
    return VIEWS_IN_FRAME.to(device)


def content_box(canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(top, bottom, left, right) [B] int64, inclusive: the bounding box of the non-background
    cells of each grid (data.features.crop_to_content); the whole grid when it has none."""
    content = (canvas > 0) & (canvas < NUM_COLOURS)
    rows, cols = content.any(2), content.any(1)  # [B, S]
    last = canvas.shape[-1] - 1
    has = rows.any(1)
    top = torch.where(has, rows.int().argmax(1), 0)
    bottom = torch.where(has, last - rows.flip(1).int().argmax(1), h - 1)
    left = torch.where(has, cols.int().argmax(1), 0)
    right = torch.where(has, last - cols.flip(1).int().argmax(1), w - 1)
    return top, bottom, left, right


def fallen(canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor, dim: int, towards_end: bool):
    """Source (row, column) [B, S, S] int64 of each cell once the grid's non-background cells have
    fallen along `dim` (1: rows, 2: columns) to its end or start, keeping their order (gravity)."""
    side = canvas.shape[-1]
    idx = torch.arange(side, device=canvas.device)
    in_grid = (idx[None, :, None] < h[:, None, None]) & (idx[None, None, :] < w[:, None, None])
    falls = (canvas != 0) if towards_end else (canvas == 0)  # these go after the others
    key = torch.where(in_grid, falls.long(), 2)  # cells outside the grid keep their place
    order = torch.sort(key, dim=dim, stable=True).indices
    rows, cols = idx[None, :, None].expand_as(order), idx[None, None, :].expand_as(order)
    return (order, cols) if dim == 1 else (rows, order)


def view_canvases(canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """canvas [B, S, S] int64 holding grids of heights h and widths w ([B] int64)
    -> views [B, 17, S, S] int64: each view encoded like a canvas (colours, EOG markers, PAD), cut to S."""
    side = canvas.shape[-1]
    i = torch.arange(side, device=canvas.device)[None, :, None]  # output row
    j = torch.arange(side, device=canvas.device)[None, None, :]  # output column
    H, W = h[:, None, None], w[:, None, None]
    top, bottom, left, right = (x[:, None, None] for x in content_box(canvas, h, w))
    # (source row, source column, output height, output width) of each view at output cell (i, j)
    sources = [
        (i, j, H, W), (j, W - 1 - i, W, H), (H - 1 - i, W - 1 - j, H, W), (H - 1 - j, i, W, H),  # k quarter turns
        (j, i, W, H), (i, W - 1 - j, H, W), (H - 1 - j, W - 1 - i, W, H), (H - 1 - i, j, H, W),  # then transposed
        *((i // s, j // s, H * s, W * s) for s in SCALES),
        *((i * s, j * s, (H + s - 1) // s, (W + s - 1) // s) for s in SCALES),
        (i + top, j + left, bottom - top + 1, right - left + 1),
        *((*fallen(canvas, h, w, dim, towards_end), H, W) for dim in (1, 2) for towards_end in (True, False)),
    ]
    flat = canvas.flatten(1)
    views = []
    for row, col, out_h, out_w in sources:
        inside = (i < out_h) & (j < out_w)
        index = (row.clamp(0, side - 1) * side + col.clamp(0, side - 1)).expand(canvas.shape[0], side, side)
        cells = flat.gather(1, index.flatten(1)).view_as(canvas)
        marker = ((i == out_h) & (j <= out_w)) | ((j == out_w) & (i <= out_h))
        views.append(torch.where(inside, cells, torch.where(marker, EOG, PAD)))
    return torch.stack(views, 1)


def views_fitting(demos: tuple[ArcPair, ...]) -> list[bool]:
    """For each view, whether it proposes (by its end-of-grid markers) each demo output's shape from
    that demo's input. A view that sizes some demo wrong is not the task's rule, and its start in
    per-task adaptation is not worth a forward pass. A view beyond 30 cells reads as 30."""
    canvas = torch.from_numpy(np.stack([encode(d.input) for d in demos]))
    views = view_canvases(canvas, *grid_extent(canvas))  # [D, V, 30, 30]
    h, w = grid_extent(views.flatten(0, 1))
    proposed = torch.stack([h, w], -1).view(len(demos), NUM_VIEWS, 2)
    wanted = torch.tensor([d.output.shape for d in demos])[:, None, :]
    return (proposed == wanted).all(-1).all(0).tolist()


class PromptedViews(nn.Module):
    """Input canvas [B, S, S] int64, grid extent (h, w) [B], prompt [B, P] -> viewed classes
    [B, S, S, 12] float32: each cell's class under every view (one-hot), mixed by the prompt's
    softmax gate over views. One-hot in, so embedding the mix equals mixing the views' embeddings."""

    def __init__(self, prompt_dim: int):
        super().__init__()
        self.gate = nn.Linear(prompt_dim, NUM_VIEWS)
        nn.init.zeros_(self.gate.weight)  # start from an even mix
        nn.init.zeros_(self.gate.bias)

    def weights(self, prompt: torch.Tensor, gate_bias: torch.Tensor | None = None) -> torch.Tensor:
        """prompt [B, P], gate_bias [B, V] or None -> each view's share of the mix [B, V] float32."""
        logits = self.gate(prompt).float()
        return (logits if gate_bias is None else logits + gate_bias.float()).softmax(-1)

    def forward(self, canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor, prompt: torch.Tensor,
                gate_bias: torch.Tensor | None = None) -> torch.Tensor:
        """`gate_bias` [B, V]: added to the gate's logits (a per-task adapter, agents/adapter.py)."""
        gate = self.weights(prompt, gate_bias)
        classes = view_canvases(canvas, h, w).permute(0, 2, 3, 1)  # [B, S, S, V]
        # each view's gate weight added at its class: the mix of one-hots without building them
        # (forward + backward, a batch of 16 at S = 30: 11 ms with one_hot and einsum, 6 ms so)
        mixed = torch.zeros(*classes.shape[:3], NUM_CLASSES, device=canvas.device)
        return mixed.scatter_add(-1, classes, gate[:, None, None, :].expand(classes.shape))
