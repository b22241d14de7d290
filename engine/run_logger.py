"""TensorBoard scalars with grouped tags, averaged over each logging interval."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter


class RunLogger:
    def __init__(self, run_dir: Path, config: dict, description: str, *, purge_step: int | None = None):
        """`purge_step`: events at this step and later, left by an earlier life of the run, are dropped."""
        self.run_dir = run_dir
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)
        self.writer.add_text("models", description, 0)
        self.sums: dict[str, torch.Tensor | float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.last: dict[str, float] = {}

    def accumulate(self, values: dict[str, torch.Tensor | float]) -> None:
        """Add values to the running means of the current interval. Tensors stay tensors (on their
        device) until `flush`, so logging costs one device sync per interval, not one per step."""
        for k, v in values.items():
            self.sums[k] = self.sums[k] + (v.detach() if torch.is_tensor(v) else v)
            self.counts[k] += 1

    def flush(self, step: int, extra: dict[str, float] | None = None) -> dict[str, float]:
        """Write the interval's means (and `extra` as they are) at `step`; start a new interval."""
        values = {k: float(self.sums[k]) / self.counts[k] for k in self.sums}
        values.update(extra or {})
        self.sums.clear()
        self.counts.clear()
        return self.write(step, values)

    def write(self, step: int, values: dict[str, float]) -> dict[str, float]:
        """Write `values` as they are at `step` (the interval's running means stay open)."""
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()
        self.last.update(values)
        return values

    def close(self) -> None:
        self.writer.close()


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run folder's TensorBoard events hold: {tag: [(step, value), ...]}."""
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
