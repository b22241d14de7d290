"""Learning rates over time: training's (`--lr_schedule`) and test-time training's (`--ttt_schedule`).

Both are a factor on each optimizer group's own base lr, recomputed before every step from a
counter the run already checkpoints, so a resumed run continues on the same curve.
"""

from __future__ import annotations

import math

import torch

from engine.config import LR_SCHEDULES

TRAIN_LR_FLOOR = 0.1  # training's cosine ends at a tenth of the base lr (nanoGPT's min_lr), not at 0
WARMUP_START = 0.01  # --lr_warmup's first factor: a step at lr 0 would be wasted


def lr_factor(schedule: str, progress: float, floor: float = 0.0) -> float:
    """The factor on the base lr at `progress` (0: the first step, 1: the end) under `schedule`; the
    cosine's is 1 at progress 0, `floor` at progress >= 1."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    raise ValueError(f"schedule {schedule!r}: choose one of {', '.join(LR_SCHEDULES)}")


def warmed_factor(schedule: str, step: int, steps: int, warmup: float) -> float:
    """Test-time training's factor at step `step` (0-based) of `steps`: a linear rise over the first
    `warmup` fraction of the steps (step k of W at (k + 1) / W, so no step is wasted at lr 0), then
    `schedule` over the steps after it (VARC's 10 warm-up epochs of 100, then a cosine)."""
    warm = round(warmup * steps)
    if step < warm:
        return (step + 1) / warm
    return lr_factor(schedule, (step - warm) / max(steps - warm, 1))


def set_lrs(optimizer: torch.optim.Optimizer, base: list[float], factor: float) -> None:
    """Every group's lr: its base lr (`base`, in group order) times `factor`."""
    for group, lr in zip(optimizer.param_groups, base, strict=True):
        group["lr"] = lr * factor


def run_progress(step: int, total_steps: int, seconds: float = 0.0, budget_seconds: float = 0.0) -> float:
    """How far a training run is, 0 to 1: by optimizer steps of `total_steps`, or by the clock of a
    `--max_minutes` budget when that is further along (the run stops at whichever ends first)."""
    by_steps = step / total_steps if total_steps else 0.0
    by_clock = seconds / budget_seconds if budget_seconds else 0.0
    return min(max(by_steps, by_clock), 1.0)


class TrainingSchedule:
    """Every training lr under `--lr_schedule`: each optimizer group's base lr times the factor at the
    run's progress. Built before a resume loads the optimizers' saved (already decayed) lrs."""

    def __init__(self, schedule: str, optimizers: list[torch.optim.Optimizer], total_steps: int,
                 budget_seconds: float = 0.0, warmup: float = 0.0):
        """`warmup`: the share of the run (by the same progress) over which the factor rises linearly
        to 1 (progress / warmup, never below WARMUP_START) before `schedule` runs over the rest
        (nanoGPT's warmup_iters)."""
        self.schedule, self.total_steps, self.budget_seconds = schedule, total_steps, budget_seconds
        self.warmup = warmup
        self.optimizers = optimizers
        self.base = [[g["lr"] for g in o.param_groups] for o in optimizers]

    def apply(self, step: int, seconds: float) -> float:
        """Set the lrs of optimizer step `step` (0-based), `seconds` into the run's clock budget. -> the factor."""
        progress = run_progress(step, self.total_steps, seconds, self.budget_seconds)
        if progress < self.warmup:
            factor = max(progress / self.warmup, WARMUP_START)
        else:
            factor = lr_factor(self.schedule, (progress - self.warmup) / (1 - self.warmup), TRAIN_LR_FLOOR)
        for optimizer, base in zip(self.optimizers, self.base, strict=True):
            set_lrs(optimizer, base, factor)
        return factor
