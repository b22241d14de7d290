"""`--eval_minutes`: a validation that ends by a wall-clock deadline, spending what is left on the
tasks not yet done (docs/runs.md, "Validation, ...": "A deadline"): an ARC Prize notebook has a hard time limit.

The pace is measured per group of tasks adapted together, in four parts (PARTS): its search over starts, an
adaptation step, a view of a test input, and the rest (its final demo loss, ranking, scoring); `Deadline.plan`
gives each group its share of the time left. On a GPU the clock synchronizes the device first
(`Deadline.synchronized`): work is queued, and a clock read without it charges a step's time to whatever waits
on it later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PARTS = ("search", "step", "view", "rest")  # what a group's time is made of (see the docstring)


class Deadline:
    def __init__(self, minutes: float, clock: Callable[[], float] = time.perf_counter, spent: float = 0.0):
        """`spent`: seconds of the budget used before a stop (the journal's), taken off it."""
        self.clock = clock
        self.spent = spent
        self.end = clock() + 60.0 * minutes - spent
        self.pace = {part: [0.0, 0] for part in PARTS}  # seconds, times measured
        self.tasks = {"full": 0, "cut": 0, "late": 0}  # planned with the full settings, cut, after the deadline
        self.group_end = self.end  # when the group being scored has spent its share
        self.searching = True  # the plan of the group being scored kept its search

    @classmethod
    def synchronized(cls, minutes: float, device: torch.device, spent: float = 0.0) -> Deadline:
        """A deadline whose clock waits for `device`'s queued work first (CUDA runs asynchronously)."""
        if device.type != "cuda":
            return cls(minutes, spent=spent)

        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return cls(minutes, clock, spent)

    def left(self) -> float:
        return self.end - self.clock()

    def cost(self, part: str) -> float:
        """Seconds one `part` has taken on average (0 before it was measured)."""
        seconds, n = self.pace[part]
        return seconds / n if n else 0.0

    def plan(self, ttt_steps: int, views: int, groups_left: int, pairs: int, tasks: int = 1) -> dict:
        """The next group's settings, overrides of the EvalCfg flags: views and adaptation steps at
        most `views` and `ttt_steps`, fitted to its share of the time left for its `pairs` test inputs
        and the `groups_left` groups (this one included) still to score; no search when one view does
        not fit beside it; after the deadline no adaptation at all (no search either) and one view.
        `tasks`: the group's, counted in `tasks`."""
        left = self.left()
        if left <= 0:
            self.tasks["late"] += tasks
            self.searching = False
            return {"ttt_steps": 0, "eval_augments": 1, "view_starts": False, "latent_steps": 0}
        share = left / max(groups_left, 1)
        self.group_end = self.clock() + share
        plan: dict = {"ttt_steps": ttt_steps, "eval_augments": views}
        if self.pace["rest"][1]:  # a group was measured: fit this one to its share
            room = share - self.cost("rest") - self.cost("search")
            view = self.cost("view") * pairs
            if room < view:  # not even one view beside the search: leave it out
                room += self.cost("search")
                plan.update(view_starts=False, latent_steps=0)
            plan["eval_augments"] = max(1, min(views, int(room / view))) if view else views
            spare = room - view * plan["eval_augments"]
            step = self.cost("step")
            plan["ttt_steps"] = max(0, min(ttt_steps, int(spare / step))) if step else ttt_steps * (spare > 0)
        self.searching = "view_starts" not in plan
        full = plan == {"ttt_steps": ttt_steps, "eval_augments": views}
        self.tasks["full" if full else "cut"] += tasks
        return plan

    def group_over(self) -> bool:
        """The group being scored has spent its share: its test-time training ends there (a first
        group, planned before any pace was measured, cannot run past its share either)."""
        return self.clock() > self.group_end

    def measured(self, search: float, steps: tuple[float, int], views: tuple[float, int], rest: float) -> None:
        """What a group took, in seconds: its `search` over starts (counted only when its plan kept
        it), its adaptation `steps` (seconds, steps), its `views` (seconds, views x test inputs) and
        the `rest`."""
        if self.searching:
            self._add("search", search, 1)
        self._add("step", *steps)
        self._add("view", *views)
        self._add("rest", rest, 1)

    def _add(self, part: str, seconds: float, n: int) -> None:
        self.pace[part][0] += seconds
        self.pace[part][1] += n

    def describe(self, tasks: int) -> str:
        """The start-up line: what the budget allows."""
        left = self.left()
        before = (f"{self.spent / 60:.1f} minutes were spent before the stop (the journal's; --new_deadline for the "
                  f"whole budget again), so ") if self.spent else ""
        return (f"--eval_minutes: {before}{max(left, 0) / 60:.1f} minutes for {tasks} tasks, "
                f"{max(left, 0) / max(tasks, 1):.1f} s a task on average; adaptation steps and views are cut to "
                f"fit as the pace is measured, and the tasks left at the deadline are predicted unadapted (one view)")
