"""ARC Prize scoring: two ranked attempts per test input, the candidates the views gave ranked by
their votes, ties broken by log-probability (`Candidates.attempts`).
The metrics of a test pair and of a task: docs/runs.md, the `eval/*` table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from data.arc import Grid
from data.augment import Augmentation
from data.view_batch import ViewSet
from evaluation.view_votes import ViewLogp, grids_logprob, vote


def grid_logprob(grid: Grid, aug: Augmentation, logp: np.ndarray) -> float:
    """Log-probability of `grid` (original frame) under one view: the view's log-softmax [S, S, 12]
    read at the cells of the augmented grid's canvas cut to S (colours and the end-of-grid markers
    that fit; PAD cells beyond them are not scored). -inf when the grid
    does not fit the canvas. One view of `evaluation.view_votes.grids_logprob`."""
    side = logp.shape[0]
    stack = ViewLogp(torch.from_numpy(logp[None]), ViewSet.of([aug], [side]), torch.tensor([side]))
    logprob, _ = grids_logprob(torch.from_numpy(grid.astype(np.int64)[None]), torch.tensor([grid.shape]), stack)
    return float(logprob[0, 0])


@dataclass
class Candidates:
    """Predictions for one test input, mapped back to the original frame, with their votes, and
    every view's log-probabilities to score them by (the augmentation scoring of the ARChitects).

    Built from a batch of views at once (`from_views`, evaluation/view_votes.py), or a view at a
    time (`add`); either way the views' log-probabilities are one `ViewLogp` (`stack`) that scores
    grids in one gather (`logprobs`: the held-out loss after adaptation)."""

    votes: dict[bytes, int] = field(default_factory=lambda: defaultdict(int))
    logprob: dict[bytes, list[float]] = field(default_factory=lambda: defaultdict(list))
    grids: dict[bytes, Grid] = field(default_factory=dict)
    view_keys: list[bytes] = field(default_factory=list)  # each view's candidate, in view order
    _stack: ViewLogp | None = field(default=None, repr=False)
    _views: list[tuple[Augmentation, np.ndarray]] = field(default_factory=list, repr=False)

    @staticmethod
    def key(grid: Grid) -> bytes:
        return np.asarray(grid.shape, dtype=np.int64).tobytes() + grid.astype(np.int64).tobytes()

    @classmethod
    def from_views(cls, stack: ViewLogp, grids: torch.Tensor, shapes: torch.Tensor, mean: torch.Tensor) -> Candidates:
        """One test input's views at once: `stack` their log-softmax, grids [V, G, G] int64 and shapes
        [V, 2] their predictions in the task's frame, mean [V] float32 each one's mean colour
        log-probability (evaluation.view_votes.decode_views, task_frame); any device."""
        first, which = vote(grids, shapes, mean)
        which = which.cpu().numpy()
        distinct, sizes = grids[first].cpu().numpy(), shapes[first].cpu().numpy()
        means = mean.double().cpu().numpy()
        order = np.argsort(which, kind="stable")  # each distinct grid's views, in view order
        bounds = np.cumsum(np.bincount(which, minlength=len(first)))[:-1]
        out = cls(_stack=stack)
        for grid, (h, w), views in zip(distinct, sizes, np.split(order, bounds), strict=True):
            grid = grid[:h, :w].copy()
            k = cls.key(grid)
            out.grids[k], out.votes[k], out.logprob[k] = grid, len(views), means[views].tolist()
        keys = list(out.grids)
        out.view_keys = [keys[c] for c in which.tolist()]
        return out

    def add(self, grid: Grid, logprob: float, aug: Augmentation | None = None, logp: np.ndarray | None = None) -> None:
        """One view's prediction (original frame) and its mean colour log-probability; with `aug` and
        that view's log-softmax `logp` [S, S, 12], the view also scores every candidate."""
        k = self.key(grid)
        self.grids[k] = grid
        self.votes[k] += 1
        self.logprob[k].append(logprob)
        self.view_keys.append(k)
        if aug is not None:
            self._views.append((aug, logp))
            self._stack = None

    @property
    def views(self) -> list[tuple[Augmentation, np.ndarray]]:
        """Each view and its log-softmax [S, S, 12] float32 (numpy, S its batch's canvas side)."""
        if not self._views and self._stack is not None:
            logp = self._stack.logp.float().cpu().numpy()
            self._views = [(aug, logp[v, :side, :side]) for v, (aug, side) in enumerate(
                zip(self._stack.views.augmentations, self._stack.side.tolist(), strict=True))]
        return self._views

    @property
    def stack(self) -> ViewLogp | None:
        """The views' log-softmax as one ViewLogp (None without views)."""
        if self._stack is None and self._views:
            self._stack = ViewLogp.cat([ViewLogp(torch.from_numpy(logp[None]), ViewSet.of([aug], [logp.shape[0]]),
                                                 torch.tensor([logp.shape[0]])) for aug, logp in self._views])
        return self._stack

    def logprobs(self, grids: list[Grid]) -> tuple[np.ndarray, np.ndarray]:
        """`grid_logprob` of each of `grids` under each view, and the cells it reads: (log-probabilities [N, V] float64,
        canvas cells read [N, V] int64), one gather on the views' device (evaluation.view_votes)."""
        stack = self.stack
        if stack is None or not grids:
            return np.zeros((len(grids), 0)), np.zeros((len(grids), 0), dtype=np.int64)
        size = max(max(g.shape) for g in grids)
        padded = np.zeros((len(grids), size, size), dtype=np.int64)
        for n, g in enumerate(grids):
            padded[n, :g.shape[0], :g.shape[1]] = g
        shapes = torch.tensor([g.shape for g in grids], dtype=torch.int64)
        logprob, cells = grids_logprob(torch.from_numpy(padded), shapes, stack)
        return logprob.cpu().numpy(), cells.cpu().numpy()

    def ranked(self) -> list[Grid]:
        """Distinct candidates, best first: most votes, ties broken by the higher mean log-probability."""
        order = sorted(self.votes, key=lambda k: (-self.votes[k], -float(np.mean(self.logprob[k]))))
        return [self.grids[k] for k in order]

    def attempts(self) -> tuple[Grid, Grid]:
        """The two attempts: the ranking's first two (the first twice when there is one candidate)."""
        order = self.ranked()
        return order[0], order[1] if len(order) > 1 else order[0]

    def contains(self, target: Grid) -> bool:
        return self.key(target) in self.grids


def _cells(pred: Grid, target: Grid, where: np.ndarray | None = None) -> float:
    if pred.shape != target.shape:
        return 0.0
    equal = pred == target
    if where is not None:
        return float(equal[where].mean()) if where.any() else float(equal.all())
    return float(equal.mean())


def pair_metrics(attempts: tuple[Grid, Grid], target: Grid, query: Grid,
                 oracle: bool | None = None) -> dict[str, float]:
    """Metrics of one test pair from its two ranked attempts (docs/runs.md, the `eval/*` table)."""
    first = attempts[0]
    changed = (query != target) if query.shape == target.shape else None
    solved = [a.shape == target.shape and bool((a == target).all()) for a in attempts]
    out = {"shape_acc": float(first.shape == target.shape), "cell_acc": _cells(first, target),
           "changed_cell_acc": _cells(first, target, changed) if changed is not None else _cells(first, target),
           "exact": float(solved[0]), "pass2": float(solved[0] or solved[1])}
    if oracle is not None:
        out["oracle"] = float(oracle)
    return out


def summarise(records: list[tuple[str, dict[str, float]]]) -> dict[str, float]:
    """Means over test pairs of every metric, plus the official and the strict task scores."""
    if not records:
        return {}
    out = {k: float(np.mean([m[k] for _, m in records])) for k in records[0][1]}
    by_task: dict[str, list[float]] = defaultdict(list)
    for task_id, m in records:
        by_task[task_id].append(m["pass2"])
    out["task_score"] = float(np.mean([np.mean(v) for v in by_task.values()]))
    out["strict_score"] = float(np.mean([float(all(v)) for v in by_task.values()]))
    return out
