"""What the grid agents share: each cell's input embedding and the prompted output layer.

A cell starts as the sum of its colour's embedding, its position (absolute and relative to the
input grid's far edges), the prompt, and (optionally) the prompt-gated geometric views of the input
and a mark on its enclosed background cells (data/enclosed.py). The output layer adds to a fixed
linear map one generated from the prompt and a prompted class map of each cell's viewed class, so a
per-task colour map can be applied (a fixed output layer cannot recolour by a rule read from the
prompt: recolour stayed at 0% without it).
"""

from __future__ import annotations

import torch
from torch import nn

from agents.adapter import AdapterSlice
from agents.views import PromptedViews
from data.arc import MAX_SIDE
from data.canvas import NUM_CLASSES, grid_extent, one_hot
from data.enclosed import enclosed_map
from engine.precision import Float32LayerNorm


class CellPosition(nn.Module):
    """Position of every cell, absolute (row, column) and relative to the input grid's far edges
    (h - 1 - row, w - 1 - column; one shared "outside" index beyond the grid). The relative part
    makes flips, rotations and transposes a matter of matching two embeddings, whatever the size.
    canvas [B, S, S] int64 (S <= `side`, the largest canvas taken) -> [B, S, S, C]."""

    def __init__(self, channels: int, side: int = MAX_SIDE):
        super().__init__()
        self.side = side
        self.row, self.col = nn.Embedding(side, channels), nn.Embedding(side, channels)
        self.row_from_end = nn.Embedding(side + 1, channels)
        self.col_from_end = nn.Embedding(side + 1, channels)
        for e in (self.row, self.col, self.row_from_end, self.col_from_end):
            nn.init.normal_(e.weight, std=0.02)

    def forward(self, canvas: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """canvas [B, S, S] int64, its grid's far edges h, w [B] int64 (data.canvas.grid_extent) -> [B, S, S, C]."""
        idx = torch.arange(canvas.shape[1], device=canvas.device)
        from_bottom = h[:, None] - 1 - idx[None, :]  # [B, S]
        from_right = w[:, None] - 1 - idx[None, :]
        outside = torch.full_like(from_bottom, self.side)
        from_bottom = torch.where(from_bottom >= 0, from_bottom, outside)
        from_right = torch.where(from_right >= 0, from_right, outside)
        return (self.row(idx)[None, :, None] + self.col(idx)[None, None, :]
                + self.row_from_end(from_bottom)[:, :, None] + self.col_from_end(from_right)[:, None, :])


class CellEmbedding(nn.Module):
    """input_canvas [B, S, S] int64 (S <= `side`), prompt [B, P] (and a per-task adapter's slice) -> (cell states
    [B, S, S, C], viewed classes [B, S, S, 12] float32: the prompt-gated views' classes, or the input's
    own one-hot without views)."""

    def __init__(self, *, prompt_dim: int, channels: int, views: bool = True, side: int = MAX_SIDE,
                 positions: bool = True):
        """`positions`: add the learned CellPosition (False: an agent that gives attention its
        positions itself, agents/rope_transformer.py)."""
        super().__init__()
        self.embed = nn.Embedding(NUM_CLASSES, channels)
        self.position = CellPosition(channels, side) if positions else None
        self.prompt_in = nn.Linear(prompt_dim, channels)
        self.views = PromptedViews(prompt_dim) if views else None
        self.view_embed = nn.Linear(NUM_CLASSES, channels, bias=False) if views else None
        # added at each enclosed background cell: a conv's reach cannot tell a hole from open
        # background when the region is larger than the demos' (fill rules missed by extrapolation).
        # As large as a colour's embedding (nn.Embedding: N(0, 1)): no training family needs it, so
        # it stays near its start, and at the positions' 0.02 test-time training could not see it.
        self.enclosed_embed = nn.Parameter(torch.randn(channels)) if views else None

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                enclosed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """enclosed: [B, S, S] bool, the canvas's enclosed background (data/enclosed.py) as the batch
        carries it; computed here when not given (on the host: a GPU's canvas is copied there)."""
        h, w = grid_extent(input_canvas)
        x = self.embed(input_canvas)
        if self.position is not None:
            x = x + self.position(input_canvas, h, w)
        x = x + self.prompt_in(prompt)[:, None, None, :]
        if self.views is None:
            return x, one_hot(input_canvas)
        viewed = self.views(input_canvas, h, w, prompt, adapter.gate_bias if adapter is not None else None)
        if enclosed is None:
            enclosed = enclosed_map(input_canvas)
        return x + self.view_embed(viewed) + enclosed[..., None].to(x.dtype) * self.enclosed_embed, viewed


class PromptedOutput(nn.Module):
    """Cell states h [B, S, S, C], prompt [B, P], viewed classes [B, S, S, 12] -> logits [B, S, S, 12].

    Three terms: a fixed output layer; one generated from the prompt (zero at start), so the
    prompt can change what any cell state means; and a 12x12 class map generated from the prompt
    (zero at start) applied to each cell's viewed class, the direct path for a per-task colour
    map (a recolour read from the demos' colour co-occurrence features)."""

    def __init__(self, *, prompt_dim: int, channels: int):
        super().__init__()
        self.norm = Float32LayerNorm(channels)
        self.out = nn.Linear(channels, NUM_CLASSES)
        self.generated = nn.Linear(prompt_dim, channels * NUM_CLASSES)
        self.class_map = nn.Linear(prompt_dim, NUM_CLASSES * NUM_CLASSES)
        for layer in (self.generated, self.class_map):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor, prompt: torch.Tensor, viewed: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        weight = self.generated(prompt).view(-1, h.shape[-1], NUM_CLASSES).to(h.dtype)
        class_map = self.class_map(prompt).view(-1, NUM_CLASSES, NUM_CLASSES).to(h.dtype)
        return (self.out(h) + torch.einsum("bhwc,bck->bhwk", h, weight)
                + torch.einsum("bhwj,bjk->bhwk", viewed.to(h.dtype), class_map))
