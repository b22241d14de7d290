"""In-context reading (`--agent_context_demos D`): the query's cells attend to the cells of the task's demos.

    each sample's first D context demos (data/episodes.py: never its own query pair; an evaluation
    task's test pairs are never context)                   input, output canvases [B, D, S, S]
      -> one token a demo cell: the agent's own embedding of the input's colour and position (the
         tables the query's cells use, so a demo cell and a query cell of one colour and place start
         alike) + the output colour's embedding (the input/output position: a demo's grids are
         placed alike, data/canvas.py, so one token holds both) + the demo's slot (pair) embedding
      -> the tokens of cells either grid covers, and one learned "no demo" token   memory [B, 1 + D*S*S, C]
    ContextRead, between the agent's blocks: cells [B, N, C] -> cells + attention(cells -> memory)

Why, and the K refinements' queries folded into one attention (`DemoSlots.repeats`): docs/model.md,
"In-context reading".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from data.canvas import NUM_CLASSES, PAD, grid_extent
from engine.precision import Float32LayerNorm


@dataclass(frozen=True)
class DemoSlots:
    """Each sample's context demos in D slots, as data.episodes.collate carries them (the first D of
    the batch's: ArcModel.demo_slots). input, output [B, D, S, S] int64 (an empty slot: all PAD),
    present [B, D] bool; `repeats`: the agent's batch is these B samples repeated this many times
    (model.forward's K refinements, sample k*B + b reading the demos of b)."""

    input: torch.Tensor
    output: torch.Tensor
    present: torch.Tensor
    repeats: int = 1


class DemoMemory(nn.Module):
    """DemoSlots and the agent's CellEmbedding -> (memory [B, 1 + D*S*S, C], valid [B, 1 + D*S*S] bool):
    the tokens of the demo cells (normalised) and which of them a query may attend to."""

    def __init__(self, channels: int, slots: int):
        super().__init__()
        self.embed_out = nn.Embedding(NUM_CLASSES, channels)
        self.slot = nn.Parameter(torch.randn(slots, channels) * 0.02)  # the pair position
        self.no_demo = nn.Parameter(torch.randn(channels) * 0.02)  # a sample without demos attends to it alone
        self.norm = Float32LayerNorm(channels)

    def forward(self, demos: DemoSlots | None, cells: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        if demos is None:
            raise ValueError("the agent reads context demos (--agent_context_demos): the batch needs them (an "
                             "EpisodeDataset built with context_demos > 0)")
        b, d, s, _ = demos.input.shape
        flat = demos.input.flatten(0, 1)  # [B*D, S, S]
        tokens = cells.embed(flat) + cells.position(flat, *grid_extent(flat))  # as a query cell's
        tokens = tokens + self.embed_out(demos.output.flatten(0, 1))
        tokens = tokens.unflatten(0, (b, d)) + self.slot[:d, None, None, :].to(tokens.dtype)  # [B, D, S, S, C]
        covered = ((demos.input != PAD) | (demos.output != PAD)) & demos.present[..., None, None]
        memory = torch.cat([self.no_demo.to(tokens.dtype).expand(b, 1, -1), tokens.reshape(b, d * s * s, -1)], 1)
        valid = torch.cat([covered.new_ones(b, 1), covered.reshape(b, -1)], 1)
        return self.norm(memory), valid


class ContextRead(nn.Module):
    """cells [R*B, N, C] (R = DemoSlots.repeats), memory [B, M, C], valid [B, M] bool -> cells + what
    each cell reads from its sample's memory (pre-norm multi-head cross-attention; zero at start)."""

    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = Float32LayerNorm(channels)
        self.query = nn.Linear(channels, channels)
        self.key_value = nn.Linear(channels, 2 * channels)
        self.out = nn.Linear(channels, channels)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, valid: torch.Tensor, repeats: int) -> torch.Tensor:
        b, m, c = memory.shape
        n, h = x.shape[1], self.heads
        # the R copies of sample b ask the same memory: one attention of R*N queries per sample
        q = self.query(self.norm(x)).view(repeats, b, n, h, c // h)
        q = q.permute(1, 3, 0, 2, 4).reshape(b, h, repeats * n, c // h)
        k, v = self.key_value(memory).to(q.dtype).view(b, m, 2, h, c // h).permute(2, 0, 3, 1, 4)
        read = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
        read = read.view(b, h, repeats, n, c // h).permute(2, 0, 3, 1, 4).reshape(repeats * b, n, c)
        return x + self.out(read)
