"""A transformer over the canvas cells with the prompt as prefix tokens.

The prompt enters as `prefix` extra tokens, through the cells' input embedding (agents/cells.py)
and through the generated output layer. `cycles` > 1 runs the same block stack again on its own
output plus the input embedding; the cells read the demos after every layer (docs/model.md).
"""

from __future__ import annotations

import torch
from torch import nn

from agents.adapter import AdapterSlice, residual_update
from agents.cells import CellEmbedding, PromptedOutput
from agents.context import ContextRead, DemoMemory, DemoSlots
from agents.contract import refuse_unread_options
from agents.views import NUM_VIEWS
from data.arc import MAX_SIDE
from engine.config import AgentCfg
from engine.errors import ConfigError
from engine.precision import Float32LayerNorm

HEADS = 4  # attention heads of each layer: the channels must divide into them


class TransformerAgent(nn.Module):
    """An agents.contract.Agent: logits [B, S, S, 12] for any S <= its canvas side."""

    def __init__(self, *, prompt_dim: int, channels: int = 64, layers: int = 3, heads: int = HEADS, prefix: int = 4,
                 cycles: int = 1, views: bool = True, canvas_side: int = MAX_SIDE, context_demos: int = 0):
        super().__init__()
        self.prefix, self.cycles, self.num_blocks, self.channels = prefix, cycles, layers, channels
        self.context_demos = context_demos
        self.num_views = NUM_VIEWS if views else 0
        self.cells = CellEmbedding(prompt_dim=prompt_dim, channels=channels, views=views, side=canvas_side)
        self.prompt_tokens = nn.Linear(prompt_dim, prefix * channels)
        block = nn.TransformerEncoderLayer(channels, heads, 4 * channels, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        block.norm1, block.norm2 = Float32LayerNorm(channels), Float32LayerNorm(channels)  # engine/precision.py: why
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = PromptedOutput(prompt_dim=prompt_dim, channels=channels)
        self.memory = DemoMemory(channels, context_demos) if context_demos else None
        self.reads = nn.ModuleList(ContextRead(channels, heads) for _ in range(layers if context_demos else 0))

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> TransformerAgent:
        refuse_unread_options(cfg, reads=("agent_channels", "agent_layers", "agent_cycles",
                                              "agent_context_demos"))
        if cfg.agent_channels % HEADS:
            raise ConfigError(f"--agent {cfg.agent} needs --agent_channels divisible by its {HEADS} attention heads, "
                              f"got {cfg.agent_channels}")
        return cls(prompt_dim=prompt_dim, channels=cfg.agent_channels, layers=cfg.agent_layers,
                   cycles=cfg.agent_cycles, views=cfg.input_views, canvas_side=cfg.canvas_side,
                   context_demos=cfg.agent_context_demos)

    def forward(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                enclosed: torch.Tensor | None = None, context: DemoSlots | None = None) -> torch.Tensor:
        cells, viewed = self.cells(input_canvas, prompt, adapter, enclosed)
        memory = self.memory(context, self.cells) if self.memory is not None else None
        cells = cells.flatten(1, 2)  # [B, S*S, C]
        prefix = self.prompt_tokens(prompt).reshape(input_canvas.shape[0], self.prefix, -1)
        x = torch.cat([prefix.to(cells.dtype), cells], 1)
        start = x
        for cycle in range(self.cycles):
            x = x if cycle == 0 else x + start
            for i, layer in enumerate(self.blocks.layers):  # what nn.TransformerEncoder does, plus the adapter
                x = residual_update(layer(x), adapter, i, channels_first=False)
                if memory is not None:  # the cells read, the prefix tokens do not
                    x = torch.cat([x[:, :self.prefix], self.reads[i](x[:, self.prefix:], *memory, context.repeats)], 1)
        h = x[:, self.prefix:].reshape(input_canvas.shape + (-1,))
        return self.head(h, prompt, viewed, adapter)

    def residual_blocks(self) -> list[nn.Module]:
        return list(self.blocks.layers)

    def late_parameters(self) -> list[nn.Parameter]:
        """The second half of the layers and the output layer (with one cycle, the backward pass
        stops halfway)."""
        half = self.num_blocks // 2
        return [*self.blocks.layers[half:].parameters(), *self.reads[half:].parameters(), *self.head.parameters()]

    def adapter_parameters(self) -> list[nn.Parameter]:
        """What reads the prompt outside the blocks: prefix tokens, the cells' prompt input and view
        gate, the output layer."""
        return [*self.prompt_tokens.parameters(), *self.cells.adapter_parameters(), *self.head.parameters()]
