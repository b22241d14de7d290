"""Grid agents: agent(input_canvas [B, S, S] int64, prompt [B, P] float, adapter slice or None) ->
logits [B, S, S, 12], where S <= 30 is the canvas side of the batch (see data/canvas.py). An agent
also names its shape for per-task adapters (agents/adapter.py): `num_blocks`, `channels`,
`num_views`."""

from torch import nn

from agents.conv_agent import FiLMConvAgent
from agents.transformer_agent import TransformerAgent
from engine.config import AgentCfg

AGENTS = {"conv": FiLMConvAgent, "transformer": TransformerAgent}


def build_agent(cfg: AgentCfg, *, prompt_dim: int) -> nn.Module:
    shape = {"layers": cfg.agent_layers, "cycles": cfg.agent_cycles} if cfg.agent == "transformer" else {}
    agent = AGENTS[cfg.agent](prompt_dim=prompt_dim, channels=cfg.agent_channels, views=cfg.input_views, **shape)
    if cfg.compile:
        agent.compile()  # in place: parameter names, and so checkpoints, stay those of the eager agent
    return agent


__all__ = ["AGENTS", "FiLMConvAgent", "TransformerAgent", "build_agent"]
