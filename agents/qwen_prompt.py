"""QwenHybridPrompt: the task prompt fused from three streams.

    qwen:     pooled Qwen features of the demo texts (cached)  -> Linear -> [B, P]
    numeric:  15 numeric task features                         -> MLP    -> [B, P]
    relation: demo input/output relation features              -> MLP    -> [B, P]
    prompt = mean (or sum) of the enabled streams              -> LayerNorm -> [B, P]

Each stream can be switched off; `QwenCfg(use_qwen=False)` gives a prompt without Qwen.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from agents.prompt_cache import PromptCache
from agents.qwen_encoder import ConfigError, QwenCfg, QwenTextEncoder
from data.features import NUMERIC_DIM, RELATION_DIM

FUSE_MODES = ("mean", "sum")


def _mlp(in_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))


class QwenHybridPrompt(nn.Module):
    def __init__(self, prompt_dim: int = 256, numeric_in_dim: int = NUMERIC_DIM, fuse: str = "mean",
                 qwen: QwenCfg = QwenCfg(), use_numeric: bool = True, use_relation: bool = True,
                 relation_in_dim: int = RELATION_DIM, prompt_refresh: int = 10, cache_dir: Path | None = None):
        super().__init__()
        if fuse not in FUSE_MODES:
            raise ConfigError(f"fuse={fuse!r}: choose one of {', '.join(FUSE_MODES)}")
        if not (qwen.use_qwen or use_numeric or use_relation):
            raise ConfigError("every prompt stream is off: enable Qwen, --use_numeric or --use_relation")
        self.fuse, self.prompt_dim = fuse, prompt_dim
        self.qwen = QwenTextEncoder(qwen) if qwen.use_qwen else None
        self.cache = PromptCache(self.qwen, prompt_refresh, cache_dir) if self.qwen is not None else None
        self.qwen_proj = nn.Linear(self.qwen.hidden_size, prompt_dim) if self.qwen is not None else None
        self.numeric_mlp = _mlp(numeric_in_dim, prompt_dim) if use_numeric else None
        self.relation_mlp = _mlp(relation_in_dim, prompt_dim) if use_relation else None
        self.norm = nn.LayerNorm(prompt_dim)

    def qwen_parameters(self) -> list[nn.Parameter]:
        """The trainable Qwen weights (all of them in `full` mode, the adapters in `lora`)."""
        return [p for p in self.qwen.parameters() if p.requires_grad] if self.qwen is not None else []

    def head_parameters(self) -> list[nn.Parameter]:
        """Everything trainable above the Qwen trunk."""
        qwen_ids = {id(p) for p in self.qwen.parameters()} if self.qwen is not None else set()
        return [p for p in self.parameters() if p.requires_grad and id(p) not in qwen_ids]

    def forward(self, demo_texts: list[tuple[str, ...]], numeric: torch.Tensor, relation: torch.Tensor,
                step: int) -> torch.Tensor:
        """demo_texts: B tuples of demo strings; numeric [B, 15], relation [B, 129] float32.

        -> prompt [B, P] (float32, or the autocast dtype). `step` drives the cache's refresh; a
        sample without a Qwen feature on this step (see PromptCache) fuses its other streams.
        """
        streams, weights = [], []  # weights [B]: 1 where a sample has that stream
        ones = torch.ones(numeric.shape[0], device=numeric.device)
        if self.qwen is not None:
            feats, present = self.cache.features(demo_texts, step, numeric.device, self.training)
            streams.append(self.qwen_proj(feats))
            weights.append(present.to(ones.dtype))
        if self.numeric_mlp is not None:
            streams.append(self.numeric_mlp(numeric))
            weights.append(ones)
        if self.relation_mlp is not None:
            streams.append(self.relation_mlp(relation))
            weights.append(ones)
        w = torch.stack(weights).unsqueeze(-1)  # [S, B, 1]
        fused = (torch.stack(streams) * w.to(streams[0].dtype)).sum(0)
        if self.fuse == "mean":
            fused = fused / w.sum(0).clamp_min(1.0).to(fused.dtype)
        return self.norm(fused)
