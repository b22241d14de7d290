"""`--eval_minutes`: a validation that ends by a wall-clock deadline, spending what is left on the
tasks not yet done.

An ARC Prize notebook has a hard time limit; a validation planned for the defaults (60 test-time
training steps, 8 views a task) can need hours on the machine it meets. The suite measures its own
pace as it goes, from the groups it has scored: seconds an adaptation step (the search included,
counted as one step, so a group with few steps is not planned too cheap) and seconds a view of a
test input. Before each group the time left is shared evenly over the groups left, and the group
gets the most steps (at most --ttt_steps) and views (at most --eval_augments) that fit its share;
its test-time training also ends when its share is spent (the first group is planned blind).
Once the deadline has passed, the tasks left get no adaptation and one view: two attempts from the
unadapted weights, a fraction of a second a task. The validation so ends within the budget plus the
group in progress when it ran out (one task with weight TTT), plus those quick predictions.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    def __init__(self, minutes: float, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.end = clock() + 60.0 * minutes
        self.adapt_seconds, self.adapt_steps = 0.0, 0  # adaptation: seconds, steps (each group's + 1: its search)
        self.predict_seconds, self.views = 0.0, 0  # prediction: seconds, views x test inputs
        self.tasks = {"full": 0, "cut": 0, "late": 0}  # planned with the full settings, cut, after the deadline
        self.group_end = self.end  # when the group being scored has spent its share

    def left(self) -> float:
        return self.end - self.clock()

    def plan(self, ttt_steps: int, views: int, groups_left: int, pairs: int, tasks: int = 1) -> dict:
        """The next group's settings, overrides of the EvalCfg flags: adaptation steps and views at
        most `ttt_steps` and `views`, fitted to its share of the time left for its `pairs` test inputs
        and the `groups_left` groups (this one included) still to score; after the deadline no
        adaptation at all (no search either) and one view. `tasks`: the group's, counted in `tasks`."""
        left = self.left()
        if left <= 0:
            self.tasks["late"] += tasks
            return {"ttt_steps": 0, "eval_augments": 1, "view_starts": False, "latent_steps": 0}
        share = left / max(groups_left, 1)
        self.group_end = self.clock() + share
        view_cost = self.predict_seconds / self.views if self.views else 0.0
        planned_views, planned_steps = views, ttt_steps
        if view_cost:
            planned_views = max(1, min(views, int(share / (view_cost * pairs))))
        if self.adapt_steps:
            spare = share - view_cost * planned_views * pairs
            planned_steps = max(0, min(ttt_steps, int(spare / (self.adapt_seconds / self.adapt_steps)) - 1))
        self.tasks["full" if (planned_steps, planned_views) == (ttt_steps, views) else "cut"] += tasks
        return {"ttt_steps": planned_steps, "eval_augments": planned_views}

    def group_over(self) -> bool:
        """The group being scored has spent its share: its test-time training ends there (a first
        group, planned before any pace was measured, cannot run past its share either)."""
        return self.clock() > self.group_end

    def measured(self, adapt_seconds: float, steps: int, predict_seconds: float, views: int, pairs: int) -> None:
        """What a group took: its adaptation (`steps` steps after its search) and its prediction
        (`views` views of each of its `pairs` test inputs)."""
        self.adapt_seconds += adapt_seconds
        self.adapt_steps += steps + 1
        self.predict_seconds += predict_seconds
        self.views += views * pairs

    def describe(self, tasks: int) -> str:
        """The start-up line: what the budget allows."""
        left = self.left()
        return (f"--eval_minutes: {left / 60:.1f} minutes for {tasks} tasks, {left / max(tasks, 1):.1f} s a task on "
                f"average; adaptation steps and views are cut to fit as the pace is measured, and the tasks left "
                f"at the deadline are predicted unadapted (one view)")
