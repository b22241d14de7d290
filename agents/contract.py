"""What every grid agent is: the model, test-time training and the per-task adapters ask this and
nothing more of it. A new agent is one file with a class that has all of it, and one line in
agents/__init__.py's AGENTS; tests/test_agents.py checks every registered agent against it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import nn

from agents.adapter import AdapterSlice

if TYPE_CHECKING:
    from engine.config import AgentCfg


@runtime_checkable
class Agent(Protocol):
    # Its shape, which a per-task adapter (agents/adapter.py) is sized by: the agent's residual
    # blocks, where it calls agents.adapter.residual_update(x, adapter, block, ...) after each;
    # the channels of its cell states; the prompt-gated views of the input it reads (0: none).
    num_blocks: int
    channels: int
    num_views: int

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> Agent:
        """The agent the flags describe, reading prompts of `prompt_dim`."""

    def __call__(self, input_canvas: torch.Tensor, prompt: torch.Tensor,
                 adapter: AdapterSlice | None = None) -> torch.Tensor:
        """input_canvas [B, S, S] int64 (S <= 30, data/canvas.py), prompt [B, P] float, an adapter's
        rows for each sample or None -> logits [B, S, S, 12] (10 colours, PAD, end-of-grid)."""

    def late_parameters(self) -> list[nn.Parameter]:
        """The second half of the blocks and the output layer (`--ttt_params late`)."""

    def adapter_parameters(self) -> list[nn.Parameter]:
        """What reads the prompt outside the blocks (`--ttt_params adapter`)."""
