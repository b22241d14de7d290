"""A batch of views decoded, mapped back to the task's frame, voted and scored as tensors, on the
device that ran the model (docs/gpu.md: scoring costs the device, not the host).

`decode_views` is `data.canvas.decode_logp` for every row of a batch, `task_frame` the views'
inverses (`Augmentation.invert_grid`) as index tensors, `vote` the distinct grids with their votes,
and `grids_logprob` the log-probability of many grids under many views in one gather (the cells of
each grid's encoded canvas but PAD; `evaluation.scoring.grid_logprob` is one view of it).
tests/test_view_batch.py holds each to its one-view reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from data.arc import MAX_SIDE
from data.canvas import EOG, NUM_COLOURS
from data.view_batch import ViewSet, end_markers, swaps_shape, task_cell, view_cell

CHUNK_CELLS = 1 << 22  # canvas cells (grids x views x S x S) one gather of `grids_logprob` reads at most


@dataclass
class ViewLogp:
    """Views' log-softmax over all classes, logp [V, S, S, 12] float32 (S the largest canvas side
    among them, a row's cells past its own side unused), their `views`, and side [V] int64 (each
    row's canvas side: its batch's)."""

    logp: torch.Tensor
    views: ViewSet
    side: torch.Tensor

    @staticmethod
    def cat(parts: list[ViewLogp]) -> ViewLogp:
        size = max(p.logp.shape[1] for p in parts)
        logp = torch.cat([torch.nn.functional.pad(p.logp, (0, 0, 0, size - p.logp.shape[2], 0, size - p.logp.shape[1]))
                          for p in parts])
        return ViewLogp(logp, ViewSet.cat([p.views for p in parts]), torch.cat([p.side for p in parts]))


def _first(hit: torch.Tensor) -> torch.Tensor:
    """hit [N, S] bool -> [N] int64: the index of the first True (S if none)."""
    return torch.where(hit.any(1), hit.int().argmax(1), torch.full_like(hit[:, 0], hit.shape[1], dtype=torch.int64))


def decode_views(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`decode_logp` of every row: logp [N, S, S, 12] float32 (one batch's, on any device; each view's
    grid read from the top-left) -> (grids [N, S, S] int64 in each view's frame,
    cells past its shape 0; shapes [N, 2] int64 (h, w); mean colour log-probability a cell [N] float32)."""
    side = logp.shape[1]
    at = torch.arange(side, device=logp.device)
    full = logp.argmax(-1)  # [N, S, S]
    # the end-of-grid markers down the grid's first column and along its first row, at least one cell
    h, w = _first(full[:, :, 0] == EOG).clamp(min=1), _first(full[:, 0, :] == EOG).clamp(min=1)
    colour = logp[..., :NUM_COLOURS]
    colour = colour - colour.logsumexp(-1, keepdim=True)  # log-softmax over the colours alone
    best, grid = colour.max(-1)
    inside = (at[None, :, None] < h[:, None, None]) & (at[None, None, :] < w[:, None, None])
    return grid * inside, torch.stack([h, w], 1), (best * inside).sum((1, 2)) / (h * w)


def task_frame(grids: torch.Tensor, shapes: torch.Tensor, views: ViewSet,
               size: int = MAX_SIDE) -> tuple[torch.Tensor, torch.Tensor]:
    """Views' grids mapped back to the task's frame (`invert_grid`): grids [N, S, S] int64 in each
    view's frame, shapes [N, 2] -> (grids [N, size, size] int64, cells past the shape 0; shapes [N, 2]
    (H, W)), size >= S."""
    n, side = grids.shape[:2]
    dev = grids.device
    k = views.dihedral.to(dev)
    turned = swaps_shape(k)
    shape = torch.where(turned[:, None], shapes.flip(1), shapes)  # (H, W)
    i, j = torch.arange(size, device=dev)[None, :, None], torch.arange(size, device=dev)[None, None, :]
    H, W = shape[:, 0, None, None], shape[:, 1, None, None]
    a, b = view_cell(k[:, None, None], H, W, i, j)
    inside = (i < H) & (j < W)
    cells = grids[torch.arange(n, device=dev)[:, None, None], a.clamp(0, side - 1), b.clamp(0, side - 1)]
    back = views.inverse.to(dev).gather(1, cells.reshape(n, -1)).view(n, size, size)
    return back * inside, shape


def vote(grids: torch.Tensor, shapes: torch.Tensor, mean: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The distinct grids among N views' (task frame: grids [N, G, G] int64, shapes [N, 2], mean colour
    log-probability [N] float32) -> (the row of each distinct grid's first view, in the order first
    seen; each view's distinct grid [N] int64, an index into that list)."""
    keys = torch.cat([shapes, grids.flatten(1)], 1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    n = len(keys)
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.int64, device=keys.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=keys.device), "amin")
    order = first.argsort()  # distinct grids in the order their first view came
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=keys.device)
    return first[order].tolist(), rank[inverse]


def grids_logprob(grids: torch.Tensor, shapes: torch.Tensor, stack: ViewLogp) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probabilities (`evaluation.scoring.grid_logprob`) of U grids (task frame: grids
    [U, G, G] int64, shapes [U, 2]) under each of V views (`stack`, on its device) -> (log-probabilities
    [U, V] float64, -inf where the grid does not fit the view's canvas; canvas cells read [U, V] int64,
    0 there). Chunked over grids, so a gather reads at most CHUNK_CELLS cells."""
    logp, views = stack.logp, stack.views
    dev = logp.device
    v, size = logp.shape[:2]
    k, side = (t.to(dev)[None, :, None, None] for t in (views.dihedral, stack.side))
    colours = views.colours.to(dev)
    p, q = torch.arange(size, device=dev)[None, None, :, None], torch.arange(size, device=dev)[None, None, None, :]
    flat = logp.reshape(v, size * size, -1)
    chunk = max(1, CHUNK_CELLS // max(v * size * size, 1))
    out, counts = [], []
    for lo in range(0, len(grids), chunk):
        g, shape = grids[lo: lo + chunk].to(dev), shapes[lo: lo + chunk].to(dev)
        u = len(g)
        H, W = shape[:, 0, None, None, None], shape[:, 1, None, None, None]
        turned = swaps_shape(k)
        vh, vw = torch.where(turned, W, H), torch.where(turned, H, W)  # [u, V, 1, 1]
        fits = (vh <= side) & (vw <= side)
        inside = (p < vh) & (q < vw)
        i, j = task_cell(k, H, W, p, q)
        cells = g[torch.arange(u, device=dev)[:, None, None, None], i.clamp(0, g.shape[1] - 1),
                  j.clamp(0, g.shape[2] - 1)]  # [u, V, S, S]
        shown = colours[torch.arange(v, device=dev)[None, :, None, None], cells]
        eog = end_markers(p, q, vh, vw)
        on_canvas = (p < side) & (q < side)
        read = (inside | eog) & on_canvas & fits
        cls = torch.where(inside, shown, torch.full_like(shown, EOG))
        index = (p * size + q).expand_as(cls).reshape(u, v, -1)
        picked = flat[torch.arange(v, device=dev)[None, :, None], index, cls.reshape(u, v, -1)]  # [u, V, S*S]
        total = (picked.double() * read.reshape(u, v, -1)).sum(-1)
        fits = fits.reshape(u, v)
        out.append(torch.where(fits, total, torch.full_like(total, float("-inf"))))
        counts.append(read.reshape(u, v, -1).sum(-1))
    return torch.cat(out), torch.cat(counts)

