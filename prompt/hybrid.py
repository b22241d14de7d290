"""QwenHybridPrompt: the task prompt fused from three streams. Pure: features in, prompt out.

    qwen:     pooled Qwen features of the demo texts (from the prompt cache) -> Linear -> [B, P]
    numeric:  15 numeric task features                                        -> MLP    -> [B, P]
    relation: demo input/output relation features                             -> MLP    -> [B, P]
    prompt = mean (or sum) of the streams each sample has                     -> LayerNorm -> [B, P]

Each stream can be switched off (`qwen_dim=0` gives a prompt without Qwen). Which Qwen features
are fresh, cached or absent is the prompt cache's business (prompt/cache.py), never this module's.
"""

from __future__ import annotations

import torch
from torch import nn

from data.features import NUMERIC_DIM, RELATION_DIM
from engine.precision import Float32LayerNorm


def _mlp(in_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))


class QwenHybridPrompt(nn.Module):
    def __init__(self, *, prompt_dim: int = 256, numeric_in_dim: int = NUMERIC_DIM,
                 qwen_dim: int = 0, use_numeric: bool = True, use_relation: bool = True,
                 relation_in_dim: int = RELATION_DIM):
        """`qwen_dim`: hidden size of the Qwen trunk whose pooled features arrive (0: no Qwen stream)."""
        super().__init__()
        if not (qwen_dim or use_numeric or use_relation):
            raise ValueError("every prompt stream is off")
        self.prompt_dim = prompt_dim
        self.qwen_proj = nn.Linear(qwen_dim, prompt_dim) if qwen_dim else None
        self.numeric_mlp = _mlp(numeric_in_dim, prompt_dim) if use_numeric else None
        self.relation_mlp = _mlp(relation_in_dim, prompt_dim) if use_relation else None
        self.norm = Float32LayerNorm(prompt_dim)

    def forward(self, numeric: torch.Tensor, relation: torch.Tensor, qwen: torch.Tensor | None = None,
                qwen_present: torch.Tensor | None = None) -> torch.Tensor:
        """numeric [B, 15], relation [B, 129] float32; qwen [B, hidden] float32 and qwen_present [B]
        bool (a sample without a Qwen feature fuses its other streams), required when the Qwen
        stream is on. -> prompt [B, P] (float32, or the autocast dtype)."""
        streams, weights = [], []  # weights [B]: 1 where a sample has that stream
        ones = torch.ones(numeric.shape[0], device=numeric.device)
        if self.qwen_proj is not None:
            if qwen is None or qwen_present is None:
                raise ValueError("the prompt has a Qwen stream: pass qwen features (prompt.cache.with_qwen_features)")
            streams.append(self.qwen_proj(qwen))
            weights.append(qwen_present.to(ones.dtype))
        if self.numeric_mlp is not None:
            streams.append(self.numeric_mlp(numeric))
            weights.append(ones)
        if self.relation_mlp is not None:
            streams.append(self.relation_mlp(relation))
            weights.append(ones)
        w = torch.stack(weights).unsqueeze(-1)  # [streams, B, 1]
        fused = (torch.stack(streams) * w.to(streams[0].dtype)).sum(0)  # the mean of a sample's streams
        return self.norm(fused / w.sum(0).clamp_min(1.0).to(fused.dtype))
