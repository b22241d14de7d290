"""A convolutional grid agent conditioned on the prompt.

The prompt enters three ways: added to every cell's embedding, as FiLM (scale and shift) in every
residual block, and as a generated correction of the output layer, so a per-task colour map can be
applied at all (a fixed output layer cannot recolour by a rule read from the prompt).
"""

from __future__ import annotations

import torch
from torch import nn

from data.arc import MAX_SIDE
from data.canvas import NUM_CLASSES


class FiLMBlock(nn.Module):
    def __init__(self, channels: int, prompt_dim: int, dilation: int):
        super().__init__()
        self.norm = nn.GroupNorm(8, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.film = nn.Linear(prompt_dim, 2 * channels)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.film(prompt)[:, :, None, None].chunk(2, dim=1)
        h = self.conv2(nn.functional.gelu(self.conv1(self.norm(x))))
        return x + h * (1 + gamma) + beta


class PromptedOutput(nn.Module):
    """Cell states [B, H, W, C] -> logits [B, H, W, 12] through a fixed output layer plus one
    generated from the prompt (zero at start), so a per-task colour map can be applied."""

    def __init__(self, prompt_dim: int, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.out = nn.Linear(channels, NUM_CLASSES)
        self.generated = nn.Linear(prompt_dim, channels * NUM_CLASSES)
        nn.init.zeros_(self.generated.weight)
        nn.init.zeros_(self.generated.bias)

    def forward(self, h: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        weight = self.generated(prompt).view(-1, h.shape[-1], NUM_CLASSES)
        return self.out(h) + torch.einsum("bhwc,bck->bhwk", h, weight.to(h.dtype))


class FiLMConvAgent(nn.Module):
    """agent(input_canvas [B, 30, 30] int64, prompt [B, P] float) -> logits [B, 30, 30, 12]."""

    def __init__(self, prompt_dim: int, channels: int = 64, dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 2, 4, 8)):
        super().__init__()
        self.embed = nn.Embedding(NUM_CLASSES, channels)
        self.position = nn.Parameter(0.02 * torch.randn(1, channels, MAX_SIDE, MAX_SIDE))
        self.prompt_in = nn.Linear(prompt_dim, channels)
        self.blocks = nn.ModuleList(FiLMBlock(channels, prompt_dim, d) for d in dilations)
        self.head = PromptedOutput(prompt_dim, channels)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_canvas).permute(0, 3, 1, 2) + self.position
        x = x + self.prompt_in(prompt)[:, :, None, None]
        for block in self.blocks:
            x = block(x, prompt)
        return self.head(x.permute(0, 2, 3, 1), prompt)  # cells [B, 30, 30, channels]
