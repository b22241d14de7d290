"""TensorBoard scalars with grouped tags, averaged over each logging interval and every process."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from engine.distributed import Dist


class IntervalMeans:
    """The running means of a logging interval's step scalars, kept by every process: a step's
    losses are each process's own samples', so the means written are over every process's values
    (one gather a log step), and a run's curves read the same at any number of processes."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor | float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, values: dict[str, torch.Tensor | float]) -> None:
        """Add a step's values. Tensors stay tensors (on their device) until `means`, so logging costs
        one device sync an interval, not one a step."""
        for k, v in values.items():
            self.sums[k] = self.sums[k] + (v.detach() if torch.is_tensor(v) else v)
            self.counts[k] += 1

    def means(self, dist: Dist) -> dict[str, float]:
        """Each value's mean over the interval's steps on every process (a collective: every process
        calls it at the same step); a new interval starts. A value some process lacks (its steps' losses
        all non-finite) is the mean of those that have it."""
        mine = {k: (float(v), self.counts[k]) for k, v in self.sums.items()}
        self.sums.clear()
        self.counts.clear()
        totals: dict[str, list[float]] = {}
        for part in dist.gather(mine):
            for k, (total, count) in part.items():
                totals.setdefault(k, [0.0, 0])
                totals[k][0] += total
                totals[k][1] += count
        return {k: total / count for k, (total, count) in totals.items()}


class RunLogger:
    """The run folder's TensorBoard events. The events file is made at the first thing written, so a run
    refused after its start-up (a validation journal written by other weights or flags) leaves no events
    of what it would have run."""

    def __init__(self, run_dir: Path, config: dict, description: str, *, purge_step: int | None = None):
        """`purge_step`: events at this step and later, left by an earlier life of the run, are dropped."""
        self.run_dir, self.purge_step = run_dir, purge_step
        self.texts = {"config": "```\n" + json.dumps(config, indent=2) + "\n```", "models": description}
        self._writer: SummaryWriter | None = None
        self.last: dict[str, float] = {}

    @property
    def writer(self) -> SummaryWriter:
        if self._writer is None:
            self._writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=self.purge_step)
            for tag, text in self.texts.items():
                self._writer.add_text(tag, text, 0)
        return self._writer

    def write(self, step: int, values: dict[str, float]) -> dict[str, float]:
        """Write `values` as they are at `step`."""
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()
        self.last.update(values)
        return values

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run folder's TensorBoard events hold: {tag: [(step, value), ...]}."""
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
