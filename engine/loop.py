"""Loop plumbing with no ML in it: moving batches, accumulation windows, seeds, signals."""

from __future__ import annotations

import random
import signal

import numpy as np
import torch
from torch.utils.data import DataLoader


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def epoch_windows(loader: DataLoader, n_batches: int, grad_accum: int, device: torch.device):
    """Yield lists of up to `grad_accum` micro-batches, `n_batches` micro-batches in all."""
    window = []
    for i, batch in zip(range(n_batches), loader):
        window.append(to_device(batch, device))
        if len(window) == grad_accum or i == n_batches - 1:
            yield window
            window = []


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the next window boundary and stops."""

    def __init__(self):
        self.signum = 0

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class TrainingStopped(Exception):
    """The run stopped early with a checkpoint; the message says why and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def summary_line(s: dict) -> str:
    parts = [f"done: {s['steps']} steps in {s['seconds']:.1f}s"]
    if "loss/combined" in s:
        parts.append(f"loss {s['loss/combined']:.4f} (efe {s['loss/efe']:.4f}, reward {s['rl/reward']:+.4f})")
    if "eval/cell_acc" in s:
        parts.append(f"eval on {s['eval/tasks']:.0f} tasks: cell_acc {s['eval/cell_acc']:.3f} exact "
                     f"{s['eval/exact']:.3f} pass@2 {s['eval/pass2']:.3f} ({s['eval/seconds_per_task']:.2f} s/task; "
                     f"copy baseline {s['eval/copy_cell_acc']:.3f} / {s['eval/copy_exact']:.3f})")
    parts.append(f"run {s['run_dir']}")
    return " | ".join(parts)


