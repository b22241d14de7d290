"""Grid agents and the Qwen hybrid prompt encoder.

Every agent: agent(input_canvas [B, S, S] int64, prompt [B, P] float) -> logits [B, S, S, 12], where
S <= 30 is the canvas side of the batch (see data/canvas.py).
"""

from agents.conv_agent import FiLMConvAgent
from agents.qwen_encoder import ConfigError, QwenCfg, QwenTextEncoder
from agents.qwen_prompt import QwenHybridPrompt
from agents.transformer_agent import TransformerAgent

AGENTS = {"conv": FiLMConvAgent, "transformer": TransformerAgent}

__all__ = ["AGENTS", "ConfigError", "FiLMConvAgent", "QwenCfg", "QwenHybridPrompt", "QwenTextEncoder",
           "TransformerAgent"]
