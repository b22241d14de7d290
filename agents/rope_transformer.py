"""A transformer over the canvas cells with 2D rotary positions, shaped for a GPU.

One token a cell (agents/cells.py's embedding, without its learned positions) and the prompt as
`prefix` extra tokens:

- attention is torch's `scaled_dot_product_attention` on [B, heads, T, 64]-shaped queries (heads of
  64 channels from 256 channels up), the call that takes the flash kernel on a GPU under bf16;
- positions are rotary: half of each head's rotary pairs turn with the cell's row, half with its
  column, so a query and a key meet at their 2D offset (mdlARC's ablation: 1D positions cost it
  44% -> 24% on ARC-AGI-1). Prefix tokens are not turned;
- every block is the same pre-norm attention + MLP, no convolution and no data-dependent shape, so
  one compile per canvas side covers every step (`--canvas full`: one shape).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from agents.adapter import AdapterSlice
from agents.cells import CellEmbedding, PromptedOutput
from agents.contract import refuse_unread_options
from agents.views import NUM_VIEWS
from engine.config import AgentCfg
from engine.errors import ConfigError
from engine.precision import Float32LayerNorm

HEAD_CHANNELS = 64  # channels of a head once the width allows (flash attention's common head size)
MIN_HEADS = 4
# Rotary wavelengths from 2*pi cells up to about 100 * 2*pi: a canvas is at most 30 cells a side, so
# the slowest pair still tells every offset apart (a language model's 10,000 spans a long text).
ROPE_BASE = 100.0


def heads_for(channels: int) -> int:
    """Attention heads of a width: heads of 64 channels, at least 4 (a narrow CPU-sized agent)."""
    return max(MIN_HEADS, channels // HEAD_CHANNELS)


def rotary_angles(side: int, prefix: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """The rotary angle of every token and pair: [prefix + side*side, head_dim // 2] float32, cell
    (r, c) at token prefix + r*side + c; the first head_dim // 4 pairs turn with r, the rest with c;
    prefix tokens at angle 0 (unturned)."""
    quarter = head_dim // 4
    freq = ROPE_BASE ** (-torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    idx = torch.arange(side, device=device, dtype=torch.float32)
    rows, cols = idx[:, None].expand(side, side).reshape(-1), idx.repeat(side)  # [S*S] each
    cells = torch.cat([rows[:, None] * freq, cols[:, None] * freq], -1)
    return torch.cat([cells.new_zeros(prefix, 2 * quarter), cells])


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] (any float dtype) turned pair by pair (pair i: channels i and i + D/2) by
    angles [T, D/2] float32 -> [B, H, T, D] in x's dtype (the turn itself in float32)."""
    x1, x2 = x.float().chunk(2, -1)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(x.dtype)


class RopeBlock(nn.Module):
    """Tokens x [B, T, C] and rotary angles [T, C/heads/2] -> x plus its change:
    pre-norm attention over all tokens, then a pre-norm MLP four times as wide."""

    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = Float32LayerNorm(channels), Float32LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels, bias=False)
        self.proj = nn.Linear(channels, channels, bias=False)
        self.up, self.down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, angles), rotate(k, angles)
        mixed = F.scaled_dot_product_attention(q, k, v)  # [B, H, T, D]
        x = x + self.proj(mixed.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class RopeTransformerAgent(nn.Module):
    """An agents.contract.Agent: logits [B, S, S, 12] for any S <= 30."""

    def __init__(self, *, prompt_dim: int, channels: int = 64, layers: int = 3, prefix: int = 4, cycles: int = 1,
                 views: bool = True):
        super().__init__()
        heads = heads_for(channels)
        if channels % heads or (channels // heads) % 4:
            raise ConfigError(f"--agent rope needs --agent_channels split into {heads} heads of a multiple of 4 "
                              f"channels (2D rotary pairs), got {channels}")
        self.prefix, self.cycles, self.num_blocks, self.channels = prefix, cycles, layers, channels
        self.head_dim = channels // heads
        self.num_views = NUM_VIEWS if views else 0
        self.cells = CellEmbedding(prompt_dim=prompt_dim, channels=channels, views=views, positions=False)
        self.prompt_tokens = nn.Linear(prompt_dim, prefix * channels)
        self.blocks = nn.ModuleList(RopeBlock(channels, heads) for _ in range(layers))
        self.head = PromptedOutput(prompt_dim=prompt_dim, channels=channels)

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> RopeTransformerAgent:
        refuse_unread_options(cfg, reads=("agent_channels", "agent_layers", "agent_cycles"))
        return cls(prompt_dim=prompt_dim, channels=cfg.agent_channels, layers=cfg.agent_layers,
                   cycles=cfg.agent_cycles, views=cfg.input_views)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                enclosed: torch.Tensor | None = None) -> torch.Tensor:
        cells, viewed = self.cells(input_canvas, prompt, adapter, enclosed)  # [B, S, S, C]
        batch, side = input_canvas.shape[:2]
        prefix = self.prompt_tokens(prompt).reshape(batch, self.prefix, -1).to(cells.dtype)
        x = start = torch.cat([prefix, cells.flatten(1, 2)], 1)  # [B, prefix + S*S, C]
        angles = rotary_angles(side, self.prefix, self.head_dim, x.device)
        for cycle in range(self.cycles):
            x = x if cycle == 0 else x + start
            for block in self.blocks:
                x = block(x, angles)
        return self.head(x[:, self.prefix:].reshape(batch, side, side, -1), prompt, viewed)

    def residual_blocks(self) -> list[nn.Module]:
        return list(self.blocks)
