"""When a training run validates, on which tasks, and what validation has cost it.

- During training (`--val_every`): after each epoch but the last, every N optimizer steps, or every M minutes
  of training; on the first `--val_tasks` evaluation tasks, the same every time, so their curve is
  comparable. One is skipped while validation has taken more than `--val_share` of the training
  time so far (the first always runs): a budgeted run spends its budget on training.
- At the end of the run: the final validation, on `--eval_tasks` (-1: every task when that is
  expected to take no longer than the training did, estimated from the `--val_tasks` ones it
  scores first; else those).

Times are the main process's clock, agreed by every process (`Dist.from_main`), so every process
takes the same branch. Nothing here moves the training: validation never touches its random streams.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EvalCfg


@dataclass
class ValidationSchedule:
    unit: str  # epoch | steps | minutes | end (--val_every)
    amount: float  # steps or minutes between validations
    share: float  # --val_share
    val_seconds: float = 0.0  # spent validating in this invocation (the final validation included)
    done: int = 0  # validations during training, this invocation
    skipped: int = 0  # validations due but skipped for --val_share
    last_at: float = 0.0  # training seconds at the last validation (or skip) due by minutes

    @classmethod
    def of(cls, cfg: EvalCfg) -> ValidationSchedule:
        unit, amount = cfg.validation_interval()
        return cls(unit, amount, cfg.val_share)

    def due(self, *, step: int, epoch_end: bool, train_seconds: float) -> bool:
        """Whether a validation during training is due after optimizer step `step` (the end of the
        run is not asked: the final validation follows it). Counts a skip when --val_share forbids it."""
        if self.unit == "epoch":
            hit = epoch_end
        elif self.unit == "steps":
            hit = step % int(self.amount) == 0
        elif self.unit == "minutes":
            hit = train_seconds - self.last_at >= 60 * self.amount
        else:
            hit = False
        if not hit:
            return False
        self.last_at = train_seconds
        if self.done and self.val_seconds > self.share * train_seconds:
            self.skipped += 1
            return False
        return True

    def describe(self, val_tasks: int, eval_tasks: int, n_tasks: int, epochs: int) -> str:
        """The start-up line's account of validation."""
        subset = f"the first {val_tasks}" if 0 < val_tasks < n_tasks else f"all {n_tasks}"
        when = {"epoch": "after each epoch" if epochs > 1 else "", "steps": f"every {int(self.amount)} steps",
                "minutes": f"every {self.amount:g} minutes of training", "end": ""}[self.unit]
        during = (f"{subset} evaluation tasks {when} (skipped while validation has taken over {self.share:.0%} of "
                  f"the training time)" if when else "none during training")
        if eval_tasks == -1 and subset != f"all {n_tasks}":
            final = f"all {n_tasks} if they take no longer than the training did, else {subset}"
        else:
            final = f"the first {eval_tasks}" if 0 < eval_tasks < n_tasks else f"all {n_tasks}"
        return f"validation: {during}; at the end {final} (--val_every, --val_tasks, --eval_tasks)"

    def report(self, train_seconds: float) -> dict[str, float]:
        """What validation cost this invocation: summary.json keys."""
        total = train_seconds + self.val_seconds
        return {"train_seconds": round(train_seconds, 1), "validation_seconds": round(self.val_seconds, 1),
                "validation_share": round(self.val_seconds / total, 3) if total else 0.0,
                "validations": self.done, "validations_skipped": self.skipped}


def fits_in_training(seconds_so_far: float, tasks_so_far: int, tasks_left: int, train_seconds: float) -> bool:
    """The final validation's `-1` rule: scoring `tasks_left` more tasks at the pace of the first
    `tasks_so_far` keeps the whole validation no longer than the training."""
    return seconds_so_far / max(tasks_so_far, 1) * (tasks_so_far + tasks_left) <= train_seconds
