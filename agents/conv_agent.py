"""A convolutional grid agent conditioned on the prompt.

The prompt enters the cells' input embedding (agents/cells.py), as FiLM (scale and shift) in every
residual block, and through the generated output layer.
"""

from __future__ import annotations

import torch
from torch import nn

from agents.adapter import AdapterSlice
from agents.cells import CellEmbedding, PromptedOutput
from agents.contract import refuse_unread_options
from agents.views import NUM_VIEWS
from engine.config import AgentCfg
from engine.errors import ConfigError

GROUPS = 8  # GroupNorm groups of each block: the channels must divide into them


class FiLMBlock(nn.Module):
    def __init__(self, *, channels: int, prompt_dim: int, dilation: int):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.film = nn.Linear(prompt_dim, 2 * channels)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.film(prompt)[:, :, None, None].chunk(2, dim=1)
        h = self.conv2(nn.functional.gelu(self.conv1(self.norm(x))))
        return x + h * (1 + gamma) + beta


class FiLMConvAgent(nn.Module):
    """An agents.contract.Agent: logits [B, S, S, 12] for any S <= 30."""

    def __init__(self, *, prompt_dim: int, channels: int = 64,
                 dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 2, 4, 8), views: bool = True):
        super().__init__()
        self.num_blocks, self.channels, self.num_views = len(dilations), channels, NUM_VIEWS if views else 0
        self.cells = CellEmbedding(prompt_dim=prompt_dim, channels=channels, views=views)
        self.blocks = nn.ModuleList(FiLMBlock(channels=channels, prompt_dim=prompt_dim, dilation=d) for d in dilations)
        self.head = PromptedOutput(prompt_dim=prompt_dim, channels=channels)

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> FiLMConvAgent:
        refuse_unread_options(cfg, reads=("agent_channels",))
        if cfg.agent_channels % GROUPS:
            raise ConfigError(f"--agent {cfg.agent} needs --agent_channels divisible by {GROUPS} (its GroupNorm "
                              f"groups), got {cfg.agent_channels}")
        return cls(prompt_dim=prompt_dim, channels=cfg.agent_channels, views=cfg.input_views)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                enclosed: torch.Tensor | None = None) -> torch.Tensor:
        x, viewed = self.cells(input_canvas, prompt, adapter, enclosed)
        x = x.permute(0, 3, 1, 2)
        for block in self.blocks:
            x = block(x, prompt)
        return self.head(x.permute(0, 2, 3, 1), prompt, viewed)  # cells [B, S, S, channels]

    def residual_blocks(self) -> list[nn.Module]:
        return list(self.blocks)
