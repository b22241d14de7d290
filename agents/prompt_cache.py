"""Cache of pooled Qwen features, so the trunk is paid for only when it has to be.

Key: (model fingerprint, text-format version, pooling, hash of the task's demo texts after
augmentation). Value: pooled features [hidden] float32 on the CPU, never holding a graph.

- Frozen Qwen: a key is encoded once (under no_grad) and reused from then on.
- Trainable Qwen: every `refresh`-th step encodes the whole batch WITH gradients (so Qwen trains on
  those steps) and stores the detached result; other steps serve cached features detached, and
  encode missing or stale (older than `refresh` steps) keys under no_grad. The projection above the
  cache gets exact gradients on every step either way.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from agents.qwen_encoder import QwenTextEncoder
from data.text import TEXT_FORMAT_VERSION

POOLING = "demo-mean"  # per-demo mean over tokens, then mean over demos


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    refreshed: int = 0  # entries encoded with gradients


class PromptCache:
    def __init__(self, encoder: QwenTextEncoder, refresh: int, max_entries: int = 200_000):
        self.encoder = encoder
        self.refresh = refresh
        self.max_entries = max_entries
        self.entries: OrderedDict[str, tuple[torch.Tensor, int]] = OrderedDict()
        self.stats = CacheStats()

    def key(self, texts: tuple[str, ...]) -> str:
        h = hashlib.sha1(f"{self.encoder.fingerprint}|v{TEXT_FORMAT_VERSION}|{POOLING}".encode())
        for t in texts:
            h.update(b"\x00" + t.encode())
        return h.hexdigest()

    def _store(self, key: str, value: torch.Tensor, step: int) -> None:
        self.entries[key] = (value.detach().to("cpu", torch.float32), step)
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def is_refresh_step(self, step: int) -> bool:
        return self.encoder.cfg.trainable and step % self.refresh == 0

    def features(self, demo_texts: list[tuple[str, ...]], step: int, device: torch.device) -> torch.Tensor:
        """demo_texts: B tuples of demo strings -> [B, hidden] float32 on `device`.

        Carries gradients to Qwen only on refresh steps of a trainable encoder.
        """
        keys = [self.key(t) for t in demo_texts]
        if self.is_refresh_step(step):
            feats = self.encoder.encode(demo_texts)
            for k, f in zip(keys, feats):
                self._store(k, f, step)
            self.stats.refreshed += len(keys)
            return feats
        trainable = self.encoder.cfg.trainable

        def fresh(k: str) -> bool:
            return k in self.entries and not (trainable and step - self.entries[k][1] >= self.refresh)

        missing: dict[str, tuple[str, ...]] = {}  # unique keys to encode, in batch order
        for k, texts in zip(keys, demo_texts):
            if not fresh(k):
                missing.setdefault(k, texts)
        n_missing = sum(not fresh(k) for k in keys)
        self.stats.hits += len(keys) - n_missing
        self.stats.misses += n_missing
        if missing:
            with torch.no_grad():
                feats = self.encoder.encode(list(missing.values()))
            for k, f in zip(missing, feats):
                self._store(k, f, step)
        return torch.stack([self.entries[k][0] for k in keys]).to(device)

    def state_dict(self) -> dict:
        """Entries and counters, so a resumed run serves exactly the features it would have served."""
        return {"entries": list(self.entries.items()), "stats": vars(self.stats).copy(),
                "tokens_encoded": self.encoder.tokens_encoded}

    def load_state_dict(self, state: dict) -> None:
        self.entries = OrderedDict(state["entries"])
        self.stats = CacheStats(**state["stats"])
        self.encoder.tokens_encoded = state["tokens_encoded"]
