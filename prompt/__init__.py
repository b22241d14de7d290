"""The prompt pipeline: the Qwen2 encoder of demo texts, the cache of its features, and the hybrid
prompt fused from Qwen, numeric and relation features."""

from prompt.cache import PromptCache, QwenFeatures, with_qwen_features
from prompt.hybrid import QwenHybridPrompt
from prompt.qwen_encoder import EncodeStopped, QwenTextEncoder

__all__ = ["EncodeStopped", "PromptCache", "QwenFeatures", "QwenHybridPrompt", "QwenTextEncoder", "with_qwen_features"]
