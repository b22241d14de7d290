"""A looped vision transformer over patches of the canvas, with the prompt as prefix tokens, as
Loop-ViT builds it (docs/model.md, "Models"): z_{t+1} = blocks(z_t + e_t), depth from loops, not parameters.

Each cell is first embedded as by the other agents (agents/cells.py) and a strided p x p convolution
makes the patch tokens; unpacked, each token is added to its cells' own embeddings (a skip: a token
holds p^2 cells, whose colours the loops need not carry). With p = 2 attention costs a sixteenth of
the cells', the MLPs a quarter.
"""

from __future__ import annotations

import torch
from torch import nn

from agents.adapter import AdapterSlice, residual_update
from agents.cells import CellEmbedding, PromptedOutput
from agents.contract import refuse_unread_options
from agents.transformer_agent import HEADS  # the same attention heads a block: the channels must divide into them
from agents.views import NUM_VIEWS
from data.arc import MAX_SIDE
from engine.config import AgentCfg
from engine.errors import ConfigError
from engine.precision import Float32LayerNorm


class HybridBlock(nn.Module):
    """Tokens [B, prefix + n*n, C] -> the same: pre-norm attention over all tokens, then an MLP whose
    hidden layer is mixed over each patch token's 3 x 3 neighbourhood (prefix tokens skip the mix)."""

    def __init__(self, channels: int, heads: int, prefix: int):
        super().__init__()
        self.prefix = prefix
        self.attn_norm, self.mlp_norm = Float32LayerNorm(channels), Float32LayerNorm(channels)
        self.attn = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.up = nn.Linear(channels, 4 * channels)
        self.local = nn.Conv2d(4 * channels, 4 * channels, 3, padding=1, groups=4 * channels)
        self.down = nn.Linear(4 * channels, channels)

    def forward(self, x: torch.Tensor, side: int) -> torch.Tensor:
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.up(self.mlp_norm(x))
        patches = h[:, self.prefix:].transpose(1, 2).unflatten(2, (side, side))  # [B, 4C, n, n]
        mixed = (patches + self.local(patches)).flatten(2).transpose(1, 2)
        h = torch.cat([h[:, :self.prefix], mixed], 1)
        return x + self.down(nn.functional.gelu(h))


class LoopViTAgent(nn.Module):
    """An agents.contract.Agent: logits [B, S, S, 12] for any S <= its canvas side."""

    def __init__(self, *, prompt_dim: int, channels: int = 64, layers: int = 3, heads: int = HEADS, prefix: int = 4,
                 cycles: int = 1, patch: int = 2, views: bool = True, canvas_side: int = MAX_SIDE):
        super().__init__()
        self.prefix, self.patch, self.num_blocks, self.channels = prefix, patch, layers, channels
        self.context_demos = 0  # it reads no demos in context (--agent_context_demos is refused)
        self.num_views = NUM_VIEWS if views else 0
        self.cells = CellEmbedding(prompt_dim=prompt_dim, channels=channels, views=views, side=canvas_side)
        self.to_tokens = nn.Conv2d(channels, channels, patch, stride=patch)
        self.to_cells = nn.Linear(channels, patch * patch * channels)
        self.prompt_tokens = nn.Linear(prompt_dim, prefix * channels)
        self.loop_step = nn.Parameter(torch.zeros(cycles, channels))  # e_t, one per pass
        self.blocks = nn.ModuleList(HybridBlock(channels, heads, prefix) for _ in range(layers))
        self.head = PromptedOutput(prompt_dim=prompt_dim, channels=channels)

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> LoopViTAgent:
        refuse_unread_options(cfg, reads=("agent_channels", "agent_layers", "agent_cycles", "agent_patch"))
        if cfg.agent_channels % HEADS:
            raise ConfigError(f"--agent {cfg.agent} needs --agent_channels divisible by its {HEADS} attention heads, "
                              f"got {cfg.agent_channels}")
        return cls(prompt_dim=prompt_dim, channels=cfg.agent_channels, layers=cfg.agent_layers,
                   cycles=cfg.agent_cycles, patch=cfg.agent_patch, views=cfg.input_views,
                   canvas_side=cfg.canvas_side)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                enclosed: torch.Tensor | None = None) -> torch.Tensor:
        cells, viewed = self.cells(input_canvas, prompt, adapter, enclosed)  # [B, S, S, C]
        batch, side = input_canvas.shape[0], input_canvas.shape[1]
        n = -(-side // self.patch)  # patches a side; the cells beyond S are zero states, cut off again below
        padded = nn.functional.pad(cells.permute(0, 3, 1, 2), (0, n * self.patch - side, 0, n * self.patch - side))
        tokens = self.to_tokens(padded).flatten(2).transpose(1, 2)  # [B, n*n, C]
        prefix = self.prompt_tokens(prompt).reshape(batch, self.prefix, -1).to(tokens.dtype)
        x = torch.cat([prefix, tokens], 1)
        for step in self.loop_step:
            x = x + step.to(x.dtype)
            for i, block in enumerate(self.blocks):
                x = residual_update(block(x, n), adapter, i, channels_first=False)
        p, c = self.patch, self.channels
        unpacked = self.to_cells(x[:, self.prefix:]).reshape(batch, n, n, p, p, c)
        h = unpacked.permute(0, 1, 3, 2, 4, 5).reshape(batch, n * p, n * p, c)[:, :side, :side]
        return self.head(h + cells, prompt, viewed, adapter)

    def residual_blocks(self) -> list[nn.Module]:
        return list(self.blocks)

    def late_parameters(self) -> list[nn.Parameter]:
        """The second half of the blocks, the unpacking and the output layer (with one loop, the
        backward pass stops halfway)."""
        return [*self.blocks[self.num_blocks // 2:].parameters(), *self.to_cells.parameters(),
                *self.head.parameters()]

    def adapter_parameters(self) -> list[nn.Parameter]:
        """What reads the prompt outside the blocks: prefix tokens, the cells' prompt input and view
        gate, the output layer."""
        return [*self.prompt_tokens.parameters(), *self.cells.adapter_parameters(), *self.head.parameters()]
