"""A transformer over the canvas cells with the prompt as prefix tokens.

The prompt enters as `prefix` extra tokens, added to every cell's embedding, and as a generated
correction of the output layer (see conv_agent.py for why). `cycles` > 1 runs the same block stack
again on its own output plus the input embedding (weight-tied recurrent refinement), a cheap way to
deepen the computation without more parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from agents.conv_agent import CellPosition, PromptedOutput
from data.canvas import NUM_CLASSES


class TransformerAgent(nn.Module):
    """agent(input_canvas [B, S, S] int64, prompt [B, P] float) -> logits [B, S, S, 12], any S <= 30."""

    def __init__(self, prompt_dim: int, channels: int = 64, layers: int = 3, heads: int = 4, prefix: int = 4,
                 cycles: int = 1):
        super().__init__()
        self.prefix, self.cycles = prefix, cycles
        self.embed = nn.Embedding(NUM_CLASSES, channels)
        self.position = CellPosition(channels)
        self.prompt_in = nn.Linear(prompt_dim, channels)
        self.prompt_tokens = nn.Linear(prompt_dim, prefix * channels)
        block = nn.TransformerEncoderLayer(channels, heads, 4 * channels, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = PromptedOutput(prompt_dim, channels)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        b = input_canvas.shape[0]
        cells = self.embed(input_canvas) + self.position(input_canvas) + self.prompt_in(prompt)[:, None, None, :]
        cells = cells.flatten(1, 2)
        prefix = self.prompt_tokens(prompt).reshape(b, self.prefix, -1)
        x = torch.cat([prefix.to(cells.dtype), cells], 1)
        start = x
        for cycle in range(self.cycles):
            x = self.blocks(x if cycle == 0 else x + start)
        h = x[:, self.prefix:].reshape(input_canvas.shape + (-1,))
        return self.head(h, prompt)
