"""What every grid agent is: the model, test-time training and the per-task adapters ask this and
nothing more of it (a new agent: docs/model.md, "Models"; tests/test_agents.py checks every registered
agent, building each as `cls(prompt_dim=..., channels=...)`, so its `__init__` takes those two by
keyword with defaults for the rest). Its `from_config` refuses what it cannot take
(`refuse_unread_options`). Its forward runs under `torch.func.vmap` (tasks adapted together, each with
its own copy of the weights: evaluation/task_batch.py), so it reads no tensor's value on the host and
changes no shape by the data (tests/test_task_batch.py adapts every agent that way)."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from agents.adapter import AdapterSlice
from engine.config import AgentCfg
from engine.errors import ConfigError


@runtime_checkable
class Agent(Protocol):
    # Its shape: the agent's residual blocks (`residual_blocks`); the prompt-gated views of the input
    # it reads (0: none), which a per-task adapter's view-gate biases are sized by (agents/adapter.py).
    num_blocks: int
    num_views: int

    @classmethod
    def from_config(cls, cfg: AgentCfg, *, prompt_dim: int) -> Agent:
        """The agent the flags describe, reading prompts of `prompt_dim`; ConfigError naming the flag
        for options it cannot take."""

    def __call__(self, input_canvas: torch.Tensor, prompt: torch.Tensor, adapter: AdapterSlice | None = None,
                 enclosed: torch.Tensor | None = None) -> torch.Tensor:
        """input_canvas [B, S, S] int64 (S <= 30; data/canvas.py), prompt
        [B, P] float, an adapter's rows for each sample or None, the canvas's enclosed background
        [B, S, S] bool as the batch carries it (data/enclosed.py; None: the agent computes it, which
        waits for a GPU) -> logits [B, S, S, 12] (10 colours, PAD, end-of-grid)."""

    def residual_blocks(self) -> list[nn.Module]:
        """The `num_blocks` residual blocks in order, each mapping its first input x to x plus a change
        of x's shape (`--ttt_dropout` drops elements of that change)."""


def refuse_unread_options(cfg: AgentCfg, *, reads: tuple[str, ...]) -> None:
    """ConfigError when an agent option (an `--agent_*` flag) that the agent `--agent` names does not
    read is set away from its default: the flag would change nothing."""
    defaults = AgentCfg()
    unread = [f"--{f.name}" for f in dataclasses.fields(cfg) if f.name.startswith("agent_") and f.name not in reads
              and getattr(cfg, f.name) != getattr(defaults, f.name)]
    if unread:
        them = "it" if len(unread) == 1 else "them"
        raise ConfigError(f"--agent {cfg.agent} does not read {', '.join(unread)}: leave {them} at the default or "
                          f"choose an agent that does")
