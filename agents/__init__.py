"""Grid agents and the Qwen hybrid prompt encoder."""

from agents.conv_agent import AGENTS, FiLMConvAgent
from agents.qwen_encoder import ConfigError, QwenCfg, QwenTextEncoder
from agents.qwen_prompt import QwenHybridPrompt

__all__ = ["AGENTS", "ConfigError", "FiLMConvAgent", "QwenCfg", "QwenHybridPrompt", "QwenTextEncoder"]
