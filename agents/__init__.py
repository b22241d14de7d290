"""Grid agents and the Qwen hybrid prompt encoder.

Every agent: agent(input_canvas [B, 30, 30] int64, prompt [B, P] float) -> logits [B, 30, 30, 12].
"""

from agents.conv_agent import FiLMConvAgent
from agents.qwen_encoder import ConfigError, QwenCfg, QwenTextEncoder
from agents.qwen_prompt import QwenHybridPrompt
from agents.transformer_agent import TransformerAgent

AGENTS = {"conv": FiLMConvAgent, "transformer": TransformerAgent}

__all__ = ["AGENTS", "ConfigError", "FiLMConvAgent", "QwenCfg", "QwenHybridPrompt", "QwenTextEncoder",
           "TransformerAgent"]
