"""Grid agents, each a file whose class has what agents/contract.py's `Agent` names, registered by
name in AGENTS (the --agent choices): a new agent is one file and one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.contract import Agent
from agents.conv_agent import FiLMConvAgent
from agents.transformer_agent import TransformerAgent

if TYPE_CHECKING:  # engine.config reads AGENT_NAMES from here
    from engine.config import AgentCfg

AGENTS: dict[str, type[Agent]] = {"conv": FiLMConvAgent, "transformer": TransformerAgent}
AGENT_NAMES = tuple(AGENTS)


def build_agent(cfg: AgentCfg, *, prompt_dim: int) -> Agent:
    agent = AGENTS[cfg.agent].from_config(cfg, prompt_dim=prompt_dim)
    if cfg.compile:
        agent.compile()  # in place: parameter names, and so checkpoints, stay those of the eager agent
    return agent


__all__ = ["AGENTS", "AGENT_NAMES", "Agent", "FiLMConvAgent", "TransformerAgent", "build_agent"]
