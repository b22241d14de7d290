"""The ARC Prize submission file: complete and valid at every moment of a validation.

ARC Prize's format: {task id: [{"attempt_1": grid, "attempt_2": grid}, ...]}, one entry per test
input in order, every task of the challenges file. The file is written (atomically: engine/files.py)
before the first task is scored, with the cheapest honest guess for every test input (the input
itself, both attempts), then rewritten after each scored group with the attempts so far, so a run
killed at any moment, or one that ran out of its --eval_minutes, leaves a complete submission.
"""

from __future__ import annotations

import json
from pathlib import Path

from data.arc import Grid
from data.episodes import EpisodeDataset
from engine.files import write_atomic


def submission_of(dataset: EpisodeDataset, attempts: dict[int, tuple[Grid, Grid]]) -> dict[str, list[dict]]:
    """Every task of `dataset` in its order (a challenges file's), every test input in order: its two
    attempts where `attempts` (by episode index) has them, else the input twice."""
    out: dict[str, list[dict]] = {}
    for i, ep in enumerate(dataset.episodes):
        a1, a2 = attempts.get(i, (ep.query.input, ep.query.input))
        out.setdefault(ep.task.task_id, []).append({"attempt_1": a1.tolist(), "attempt_2": a2.tolist()})
    return out


class SubmissionFile:
    """`path`, written with the fallback attempts now and again on each `update`."""

    def __init__(self, path: Path, dataset: EpisodeDataset):
        self.path, self.dataset = path, dataset
        path.parent.mkdir(parents=True, exist_ok=True)
        self.update({})

    def update(self, attempts: dict[int, tuple[Grid, Grid]]) -> None:
        write_atomic(self.path, json.dumps(submission_of(self.dataset, attempts)))
