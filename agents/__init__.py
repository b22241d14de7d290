"""Grid agents, each a file whose class has what agents/contract.py's `Agent` names, registered by
name in AGENTS (the --agent choices)."""

from __future__ import annotations

from agents.contract import Agent
from agents.conv_agent import FiLMConvAgent
from agents.rope_transformer import RopeTransformerAgent
from engine.config import AgentCfg
from engine.errors import ConfigError

AGENTS: dict[str, type[Agent]] = {"conv": FiLMConvAgent, "rope": RopeTransformerAgent}


def build_agent(cfg: AgentCfg, *, prompt_dim: int) -> Agent:
    """The agent `--agent` names, built by its own `from_config` (which refuses options it cannot
    take), reading prompts of `prompt_dim`."""
    if cfg.agent not in AGENTS:
        raise ConfigError(f"--agent {cfg.agent}: no such agent; choose one of {', '.join(AGENTS)}")
    agent = AGENTS[cfg.agent].from_config(cfg, prompt_dim=prompt_dim)
    if cfg.compile:
        # in place: parameter names, and so checkpoints, stay those of the eager agent. "blocks": each residual
        # block compiled alone, the blocks sharing one graph (torch's regional compilation), so a compile costs
        # one block's, not the whole agent's
        for module in agent.residual_blocks() if cfg.compile_scope == "blocks" else [agent]:
            module.compile(backend=cfg.compile_backend, mode=cfg.compile_mode)
    return agent


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process: dynamo's and inductor's forward
    graphs, and the backward graphs inductor compiles at their first backward (torch's own account,
    torch._dynamo.utils.compilation_time_metrics). A run's --max_minutes counts them: they are spent
    inside its first steps."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(phase, ())) for phase in ("_compile.compile_inner",
                                                                          "backward._backward_impl"))


__all__ = ["AGENTS", "Agent", "FiLMConvAgent", "RopeTransformerAgent", "build_agent", "compile_seconds"]
