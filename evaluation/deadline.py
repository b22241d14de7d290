"""`--eval_minutes`: a validation that ends by a wall-clock deadline (an ARC Prize notebook has a hard
time limit), spending what is left on the tasks not yet done (docs/runs.md, "A deadline").

A group's share of the time left follows its cost in full at the pace measured so far (`Deadline.share`);
when the time cannot pay every group in full, it pays every group's search (when on), views and rest first, then the
small tasks' steps (ttt_policy.size_class: cheap, and where the frontier's gain is), then the large tasks'.
The pace is kept in four parts (PARTS), each within a size class (a class not yet measured at the other's)
and, but for a view (per view and test input), per group size (tasks adapted together: a step of K tasks
costs about K times one on a CPU, less on a GPU; a size not yet measured is priced from the nearest, in
proportion), so tasks that cost the same get the same settings alone or in a group. What a group leaves
unspent goes to the groups after it. On a GPU the clock synchronizes the device first (`synchronized`):
work is queued, and a clock read without it charges a step's time to whatever waits on it later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

PARTS = ("search", "step", "view", "rest")  # what a group's time is made of (see the docstring)
VIEW_SIZE = 1  # a view's pace is kept under one size: it is priced per view and test input


@dataclass(frozen=True)
class Work:
    """A group of tasks still to score, as the deadline plans it: its size class (ttt_policy.size_class),
    tasks (adapted together), test inputs, and adaptation steps under the full settings."""
    kind: str
    tasks: int
    pairs: int
    steps: int


class Deadline:
    def __init__(self, minutes: float, clock: Callable[[], float] = time.perf_counter, spent: float = 0.0,
                 searches: bool = True):
        """`spent`: seconds of the budget used before a stop (the journal's), taken off it; `searches`:
        whether adaptation searches over starts (--view_starts), the one part a plan may leave out
        whole. Without it, the time before a group's first step (its demo episodes' set-up) is the rest's."""
        self.clock = clock
        self.searches = searches
        self.spent = spent
        self.end = clock() + 60.0 * minutes - spent
        # part -> {(size class, group size): [seconds, times measured]} (a view's under VIEW_SIZE)
        self.pace: dict[str, dict[tuple[str, int], list]] = {part: {} for part in PARTS}
        self.tasks = {"full": 0, "cut": 0, "late": 0}  # planned with the full settings, cut, after the deadline
        self.group_end = self.end  # when the group being scored has spent its share
        self.searching = searches  # the plan of the group being scored kept its search

    @classmethod
    def synchronized(cls, minutes: float, device: torch.device, spent: float = 0.0,
                     searches: bool = True) -> Deadline:
        """A deadline whose clock waits for `device`'s queued work first (CUDA runs asynchronously)."""
        if device.type != "cuda":
            return cls(minutes, spent=spent, searches=searches)

        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return cls(minutes, clock, spent, searches)

    def left(self) -> float:
        return self.end - self.clock()

    def cost(self, part: str, tasks: int = VIEW_SIZE, kind: str = "") -> float:
        """Seconds one `part` takes for a group of `tasks` of size class `kind` (0 before any group was
        measured): the mean at that size, else the nearest measured size's in proportion to the tasks;
        a class not measured yet, the others'."""
        paces = self.pace[part]
        sizes = {k: v for (c, k), v in paces.items() if c == kind} or {k: v for (_, k), v in paces.items()}
        if not sizes:
            return 0.0
        nearest = tasks if tasks in sizes else min(sizes, key=lambda k: (abs(k - tasks), k))
        seconds, n = sizes[nearest]
        return seconds / n * tasks / nearest if n else 0.0

    def plan(self, work: list[Work], views: int) -> dict:
        """The settings of the group `work[0]`, overrides of the EvalCfg flags: views and adaptation steps
        at most `views` and its steps, fitted to its share of the time left (`share`, over `work`: this
        group and every group still to score after it) for its test inputs at the pace of its size class;
        no search when one view does not fit beside it; after the deadline no adaptation at all (no search
        either) and one view."""
        group, left = work[0], self.left()
        if left <= 0:
            self.tasks["late"] += group.tasks
            self.searching = False
            return {"ttt_steps": 0, "eval_augments": 1, "view_starts": False}
        share = self.share(work, views, left)
        self.group_end = self.clock() + share
        kind, tasks = group.kind, group.tasks
        plan: dict = {"ttt_steps": group.steps, "eval_augments": views}
        if self.pace["rest"]:  # a group was measured: fit this one to its share
            room = share - self.cost("rest", tasks, kind) - self.cost("search", tasks, kind)
            view = self.cost("view", VIEW_SIZE, kind) * group.pairs
            if room < view and self.searches:  # not even one view beside the search: leave it out
                room += self.cost("search", tasks, kind)
                plan.update(view_starts=False)
            # + 1e-9: a share that fits n views or steps exactly plans n, not n - 1 by a float's rounding
            plan["eval_augments"] = max(1, min(views, int(room / view + 1e-9))) if view else views
            spare = room - view * plan["eval_augments"]
            step = self.cost("step", tasks, kind)
            fits = int(spare / step + 1e-9) if step else group.steps * (spare > 0)
            plan["ttt_steps"] = max(0, min(group.steps, fits))
        self.searching = self.searches and "view_starts" not in plan
        full = plan == {"ttt_steps": group.steps, "eval_augments": views}
        self.tasks["full" if full else "cut"] += tasks
        return plan

    def share(self, work: list[Work], views: int, left: float) -> float:
        """Seconds of the `left` for the group `work[0]` (see the module's docstring). The time left pays,
        in this order, every group's cost without steps (its search, views and rest), the small groups'
        steps, then the large groups' steps; a group's part of what pays its class's steps is in
        proportion to its steps' cost, and of less than every group's cost without steps, to that cost.
        A small group's share also holds the large groups' steps, as room to overrun its estimate."""
        # priced once for each kind of group (a few), not for each of the hundreds still to score
        priced = {w: (self.seconds(w, views), self.seconds(w, views, steps=False)) for w in set(work)}
        full, bare = (sum(priced[w][i] for w in work) for i in (0, 1))
        group_full, group_bare = priced[work[0]]
        if not full:  # nothing measured yet: an even share a task
            return left * work[0].tasks / sum(w.tasks for w in work)
        if left >= full:  # time for every group in full: the spare shared by cost
            return left * group_full / full
        if left <= bare:
            return left * group_bare / bare
        small = work[0].kind == "small"
        small_steps = sum(priced[w][0] - priced[w][1] for w in work if w.kind == "small")
        before = 0.0 if small else small_steps  # the steps paid before this group's class's
        mine = small_steps if small else full - bare - small_steps
        paid = min(max(left - bare - before, 0.0), mine)  # what the class's steps get
        own = group_bare + (paid * (group_full - group_bare) / mine if mine else 0.0)
        # a small group may run on into the large tasks' steps: its pace is a mean over tasks of several sides
        # (without it, measured at 1ea72aa, the small tasks' steps were cut to 101 of 120 where 112 fitted)
        return own + max(left - bare - mine, 0.0) if small else own

    def seconds(self, w: Work, views: int, steps: bool = True) -> float:
        """What group `w` costs at the pace measured so far with `views` and its steps (none: `steps` False)."""
        k, t = w.kind, w.tasks
        return (self.cost("search", t, k) + self.cost("rest", t, k) + self.cost("view", VIEW_SIZE, k) * w.pairs * views
                + self.cost("step", t, k) * w.steps * steps)

    def group_over(self) -> bool:
        """The group being scored has spent its share: its test-time training ends there (a first
        group, planned before any pace was measured, cannot run past its share either)."""
        return self.clock() > self.group_end

    def measured(self, search: float, steps: tuple[float, int], views: tuple[float, int], rest: float,
                 tasks: int = 1, kind: str = "") -> None:
        """What a group of `tasks` of size class `kind` took, in seconds: its `search` over starts (the
        time before its first step; the rest's without --view_starts), its adaptation `steps` (seconds,
        steps), its `views` (seconds, views x test inputs) and the `rest`."""
        if self.searching:
            self._add("search", (kind, tasks), search, 1)
        self._add("step", (kind, tasks), *steps)
        self._add("view", (kind, VIEW_SIZE), *views)
        # without the search its set-up is the rest's; a plan that cut the search drops it (a group that
        # searches holds it in its search, and counting it in the rest too would charge it twice)
        self._add("rest", (kind, tasks), rest + (0.0 if self.searches else search), 1)

    def _add(self, part: str, key: tuple[str, int], seconds: float, n: int) -> None:
        if not n:  # a group that took no step measured no step's cost
            return
        pace = self.pace[part].setdefault(key, [0.0, 0])
        pace[0] += seconds
        pace[1] += n

    def describe(self, tasks: int) -> str:
        """The start-up line: what the budget allows."""
        left = self.left()
        before = (f"{self.spent / 60:.1f} minutes were spent before the stop (the journal's; --new_deadline for the "
                  f"whole budget again), so ") if self.spent else ""
        return (f"--eval_minutes: {before}{max(left, 0) / 60:.1f} minutes for {tasks} tasks, "
                f"{max(left, 0) / max(tasks, 1):.1f} s a task on average; adaptation steps and views are cut to "
                f"fit as the pace is measured, and the tasks left at the deadline are predicted unadapted (one view)")
