"""One policy for test-time training, whether one task adapts alone (evaluation/adaptation.py `_fit`)
or tasks' shared weights adapt together (evaluation/task_batch.py `fit_together`): both loops ask it
every step.

- Steps: `steps`, every one; none once `stop()` asks (the caller discards the result) or `enough()`
  says the time is spent (--eval_minutes: the tasks are predicted as adapted so far). No early stop:
  demos exact under the views a task trains on come before what generalizes (docs/results.md, "The
  frontier by task size": a stop lost on the small tasks and never fired on the large ones).
- By size (`by_size`): a small task (every grid known before its test outputs at most SMALL_SIDE a
  side) takes --ttt_small_steps steps: its steps are cheap, and the frontier's gain is there.
- Learning rate: each group's own, times the warm-up over the first `warmup` fraction of `steps`
  and `schedule` (engine/schedule.py).
- Clip: `clip` > 0 scales a task's gradient to that global norm at most (clip_grad_norm_'s rule).
- A gradient that is not finite: the step is not applied, and adaptation of what that gradient
  trains ends with the weights from before it (what was learned so far is kept). Tasks adapted
  together have a gradient each (fit_together: the task stops, the others go on). Under --amp fp16
  the scaler's skipped steps are its search for a loss scale, not a fault: adaptation goes on (the
  shared weights then adapt one task at a time, task_batch.batches_shared_weights).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from data.arc import ArcTask
from engine.config import EvalCfg
from engine.schedule import warmed_factor

SMALL_SIDE = 10  # 78 of ARC-AGI-1's 400 evaluation tasks, 179 of its 400 training tasks


def is_small(task: ArcTask) -> bool:
    """Every grid known before the task's test outputs (demos, test inputs) at most SMALL_SIDE a side."""
    return task.known_side <= SMALL_SIDE


def of_size(tasks: tuple[ArcTask, ...], size: str) -> tuple[ArcTask, ...]:
    """The tasks of a size class (--eval_size: all, small or large), in their order."""
    return tasks if size == "all" else tuple(t for t in tasks if is_small(t) == (size == "small"))


def size_class(e: EvalCfg, task: ArcTask) -> str:
    """"small" or "large" where the size rule is on (test-time training, --ttt_small_steps), else ""."""
    return "" if not (e.ttt_steps and e.ttt_small_steps) else "small" if is_small(task) else "large"


def by_size(e: EvalCfg, tasks: list[ArcTask]) -> dict:
    """The overrides of the EvalCfg flags that a group of tasks of one size class adapts with: a small
    task's steps, nothing for the rest or with the rule off."""
    classes = {size_class(e, t) for t in tasks}
    if len(classes) != 1:
        raise ValueError(f"tasks of two size classes in one group: {[t.task_id for t in tasks]}")
    return {"ttt_steps": e.ttt_small_steps} if classes == {"small"} else {}


@dataclass(frozen=True)
class TTTPolicy:
    steps: int
    schedule: str = "constant"
    warmup: float = 0.0
    clip: float = 0.0
    stop: Callable[[], bool] = lambda: False
    enough: Callable[[], bool] = lambda: False

    @classmethod
    def test_time(cls, e: EvalCfg, clip: float, stop: Callable[[], bool], enough: Callable[[], bool]) -> TTTPolicy:
        """Test-time training's: --ttt_steps, --ttt_schedule, --ttt_warmup, `clip`."""
        return cls(e.ttt_steps, e.ttt_schedule, e.ttt_warmup, clip, stop, enough)

    def goes_on(self, tried: int) -> bool:
        """Whether step `tried` + 1 is taken."""
        return tried < self.steps and not self.stop() and not self.enough()

    def lr_factor(self, tried: int) -> float:
        """What every group's lr is multiplied by in step `tried` + 1."""
        return warmed_factor(self.schedule, tried, self.steps, self.warmup)

    def clip_factor(self, norms: torch.Tensor) -> torch.Tensor:
        """Each task's gradient norm [K] float32 -> what its gradient is multiplied by [K] float32:
        clip / (norm + 1e-6) where that is below 1, as torch.nn.utils.clip_grad_norm_ does."""
        if self.clip <= 0:
            return torch.ones_like(norms)
        return (self.clip / (norms + 1e-6)).clamp(max=1.0)
