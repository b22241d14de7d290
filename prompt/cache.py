"""Cache of pooled Qwen features per demo text, so the trunk is paid for only when it has to be
(docs/model.md, "The Qwen prompt and its cache": the frozen and the trainable policy, the shards).

Key: sha1 of (model fingerprint (weights, dtype, pooling), text-format version, demo text after
augmentation). Value: pooled features [hidden] float32 on the encoder's device, never holding a
graph: on a GPU a step reads its batch's features without a copy from the host (a copy from
pageable memory blocks the host until the GPU has caught up), at hidden x 4 bytes an entry of GPU
memory (Qwen2.5-0.5B: 3.5 KB; a run on ARC-AGI-1 met 21,753 demo texts, 76 MB at that size).
Checkpoints and the cache folder hold them on the CPU. Evaluation encodes what it misses, without
gradients; the projection above the cache gets exact gradients whenever the stream is present.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from data.text import TEXT_FORMAT_VERSION
from engine.loop import host_to_device
from prompt.qwen_encoder import EncoderStats, QwenTextEncoder


@dataclass
class CacheStats:
    hits: int = 0  # demo features served from the cache
    misses: int = 0  # demo features encoded without gradients
    absent: int = 0  # trainable, between refreshes: tasks served without a Qwen stream
    refreshed: int = 0  # demo features encoded with gradients
    dropped_demos: int = 0  # demos left out to fit --max_prompt_tokens
    loaded: int = 0  # entries read from the cache folder
    corrupt_files: int = 0


def _checksum(entries: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(entries):
        h.update(k.encode())
        h.update(entries[k].numpy().tobytes())
    return h.hexdigest()


class DiskShards:
    """Cache entries on disk: append-only safetensors shards, each with a sha256 of its content.

    A shard that fails to parse or to match its checksum is reported on stderr, renamed to
    `*.corrupt` and never used; its prompts are recomputed and written again.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)

    def load(self, stats: CacheStats) -> dict[str, torch.Tensor]:
        entries: dict[str, torch.Tensor] = {}
        for shard in sorted(self.folder.glob("*.safetensors")):
            try:
                with safe_open(str(shard), "pt") as fh:
                    expected = (fh.metadata() or {}).get("sha256")
                    data = {k: fh.get_tensor(k) for k in fh.keys()}
                ok, reason = expected == _checksum(data), "checksum mismatch"
            except (SafetensorError, OSError, ValueError) as err:
                ok, reason = False, str(err).splitlines()[0]
            if not ok:
                print(f"warning: prompt cache shard {shard} is corrupt ({reason}); ignored, its prompts "
                      f"will be recomputed", file=sys.stderr)
                os.replace(shard, shard.with_suffix(".corrupt"))
                stats.corrupt_files += 1
                continue
            entries.update(data)
        stats.loaded += len(entries)
        return entries

    def write(self, entries: dict[str, torch.Tensor]) -> None:
        if not entries:
            return
        name = f"shard-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{len(entries)}"
        tmp = self.folder / f".{name}.tmp"
        save_file(entries, str(tmp), metadata={"sha256": _checksum(entries)})
        os.replace(tmp, self.folder / f"{name}.safetensors")


class PromptCache:
    """Qwen features for batches of demo texts: served from memory, encoded when needed.

    `micro_batch` is the index of the training micro-batch asking (it decides the refreshes of a
    trainable encoder). The constructor does no I/O; `open_disk` attaches a cache folder.
    """

    def __init__(self, encoder: QwenTextEncoder, *, refresh: int, max_entries: int = 1_000_000):
        self.encoder = encoder
        self.refresh = refresh
        self.max_entries = max_entries
        self.device = encoder.device  # where the entries live: the trunk's, so encoding moves nothing
        self.entries: OrderedDict[str, tuple[torch.Tensor, int]] = OrderedDict()  # key -> (feature, micro-batch)
        self.stats = CacheStats()
        self.unsaved: dict[str, torch.Tensor] = {}
        self.disk: DiskShards | None = None

    def open_disk(self, folder: Path) -> None:
        """Read the entries of earlier runs from `folder` and write new ones there. A trainable
        encoder's features change as it trains: they are never shared through disk."""
        if self.encoder.cfg.trainable:
            return
        self.disk = DiskShards(Path(folder) / f"{self.encoder.fingerprint}-v{TEXT_FORMAT_VERSION}")
        for k, v in self.disk.load(self.stats).items():
            self.entries[k] = (v.to(self.device), 0)

    def key(self, text: str) -> str:
        # The fingerprint covers the weights, their dtype and the pooling.
        h = hashlib.sha1(f"{self.encoder.fingerprint}|v{TEXT_FORMAT_VERSION}|".encode())
        h.update(text.encode())
        return h.hexdigest()

    def _store(self, key: str, value: torch.Tensor, micro_batch: int) -> None:
        value = value.detach().to(self.device, torch.float32)
        self.entries[key] = (value, micro_batch)
        self.entries.move_to_end(key)
        if self.disk is not None:
            self.unsaved[key] = value
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def is_refresh(self, micro_batch: int) -> bool:
        return self.encoder.cfg.trainable and micro_batch % self.refresh == 0

    def features(self, demo_texts: list[tuple[str, ...]], micro_batch: int, device: torch.device,
                 training: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """demo_texts: B tuples of demo strings -> (features [B, hidden] float32 on `device`, the
        mean of each task's demo features; present [B] bool, False where a task has no feature:
        no demos, or a trainable encoder between refreshes with a demo not fresh in the cache).

        Carries gradients to Qwen only on refresh micro-batches of a trainable encoder in training.
        """
        tasks = []
        for texts in demo_texts:
            kept, dropped = self.encoder.fit_budget(texts)
            self.stats.dropped_demos += dropped
            tasks.append([(self.key(t), t) for t in kept])
        unique = dict(kd for task in tasks for kd in task)  # key -> text, in batch order
        trainable = self.encoder.cfg.trainable
        if training and self.is_refresh(micro_batch):
            feats = self.encoder.encode(list(unique.values()))
            by_key = dict(zip(unique, feats, strict=True))
            for k, f in by_key.items():
                self._store(k, f, micro_batch)
            self.stats.refreshed += len(unique)
        else:
            fresh = {k for k in unique
                     if k in self.entries and not (trainable and micro_batch - self.entries[k][1] >= self.refresh)}
            todo = {} if (trainable and training) else {k: t for k, t in unique.items() if k not in fresh}
            self.stats.hits += len(fresh)
            self.stats.misses += len(todo)
            if todo:
                with torch.no_grad():
                    for k, f in zip(todo, self.encoder.encode(list(todo.values())), strict=True):
                        self._store(k, f, micro_batch)
                fresh |= set(todo)
            by_key = {k: self.entries[k][0] for k in fresh}
        # a task has a feature when every demo of it has one
        served = [[k for k, _ in task] if all(k in by_key for k, _ in task) else [] for task in tasks]
        self.stats.absent += sum(bool(task) and not keys for task, keys in zip(tasks, served, strict=True))
        feats, present = self._task_means(served, by_key)
        return feats.to(device, non_blocking=True), present.to(device, non_blocking=True)

    def _task_means(self, tasks: list[list[str]], by_key: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each task's mean of its keys' features -> ([B, hidden] float32, zeros for a task without
        keys; present [B] bool), on the cache's device. One stack of every row and one index_add,
        whatever B: a fixed handful of kernels on a GPU, where a stack and a mean a task would be
        two launches each; the indices cross to the device in one copy (engine.loop.host_to_device)."""
        rows = [by_key[k] for task in tasks for k in task]
        owner = [i for i, task in enumerate(tasks) for _ in task]
        counts = [max(len(task), 1) for task in tasks]
        present = [int(bool(task)) for task in tasks]
        index = host_to_device(torch.tensor(owner + counts + present, dtype=torch.int64), self.device)
        owner_t, counts_t, present_t = index.split([len(owner), len(tasks), len(tasks)])
        sums = torch.zeros(len(tasks), self.encoder.hidden_size, device=self.device)
        if rows:
            sums = sums.index_add(0, owner_t, torch.stack(rows))
        return sums / counts_t.unsqueeze(-1).float(), present_t.bool()

    def flush(self) -> None:
        """Write the entries made since the last flush to the cache folder (frozen encoder only)."""
        if self.disk is not None:
            self.disk.write({k: v.cpu() for k, v in self.unsaved.items()})
            self.unsaved = {}

    def scalars(self) -> dict[str, float]:
        """`cache/*` for TensorBoard: the counters above and the tokens the trunk has read."""
        return {**{f"cache/{k}": v for k, v in vars(self.stats).items()},
                "cache/qwen_tokens_encoded": self.encoder.stats.tokens}

    def state_dict(self) -> dict:
        """Entries and counters, so a resumed run serves exactly the features it would have served.
        With a cache folder the entries are on disk already (call `flush` first) and not repeated."""
        entries = [] if self.disk is not None else [(k, (v.cpu(), mb)) for k, (v, mb) in self.entries.items()]
        return {"entries": entries, "stats": vars(self.stats).copy(), "encoder_stats": vars(self.encoder.stats).copy()}

    def load_state_dict(self, state: dict) -> None:
        self.entries.update((k, (v.to(self.device), mb)) for k, (v, mb) in state["entries"])
        self.stats = CacheStats(**state["stats"])
        self.encoder.stats = EncoderStats(**state["encoder_stats"])


class QwenFeatures(Protocol):
    """What the training step and evaluation ask of a prompt cache (benchmarks plug in other policies)."""

    def features(self, demo_texts: list[tuple[str, ...]], micro_batch: int, device: torch.device,
                 training: bool = True) -> tuple[torch.Tensor, torch.Tensor]: ...

    def scalars(self) -> dict[str, float]: ...


def with_qwen_features(batch: dict, cache: QwenFeatures | None, micro_batch: int, training: bool) -> dict:
    """The batch with `qwen` [B, hidden] float32 and `qwen_present` [B] bool added (unchanged without
    a Qwen stream): what the model's prompt reads beside the numeric and relation features."""
    if cache is None:
        return batch
    feats, present = cache.features(batch["demo_texts"], micro_batch, batch["numeric"].device, training)
    return {**batch, "qwen": feats, "qwen_present": present}
