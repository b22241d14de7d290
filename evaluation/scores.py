"""What scoring evaluation tasks gives (`TaskScores`, gathered from every process): its metrics with
their intervals, the report's cards, TensorBoard's task images (a final validation publishes them
with its submission: evaluation.evaluate.EvalResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from data.arc import Grid
from data.episodes import EpisodeDataset
from engine.config import Config
from evaluation.heldout import PairLoss, loss_metrics
from evaluation.intervals import interval
from evaluation.render import task_image
from evaluation.report import task_cards
from evaluation.scoring import summarise

IMAGES = 4  # tasks drawn as images for TensorBoard
INTERVALS = ("pass2", "exact", "oracle", "task_score")  # the scores with a 95% interval (evaluation.intervals)


@dataclass
class TaskScores:
    """What scoring some evaluation tasks gave, gathered from every process."""

    # episode index (a test input) -> (task id, pair metrics)
    records: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)
    copy_records: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)  # copying the input
    attempts: dict[int, tuple[Grid, Grid]] = field(default_factory=dict)  # episode index -> its two attempts
    seconds: dict[str, float] = field(default_factory=dict)  # task id -> seconds adapting to and predicting it
    ttt_steps: dict[str, int] = field(default_factory=dict)  # task id -> test-time-training steps taken
    # episode index -> its held-out loss after adaptation (evaluation/heldout.py)
    losses: dict[int, PairLoss] = field(default_factory=dict)
    unanswered: set[int] = field(default_factory=set)  # episodes predicted without a known output (no records)

    def merged(self, other: TaskScores) -> TaskScores:
        return TaskScores({**self.records, **other.records}, {**self.copy_records, **other.copy_records},
                          {**self.attempts, **other.attempts}, {**self.seconds, **other.seconds},
                          {**self.ttt_steps, **other.ttt_steps}, {**self.losses, **other.losses},
                          self.unanswered | other.unanswered)

    def solved(self, episodes: list[int]) -> tuple[int, float]:
        """Of `episodes`: the test inputs scored (a known output) and how many pass@2 solves."""
        scored = [self.records[i][1]["pass2"] for i in episodes if i in self.records]
        return len(scored), float(sum(scored))

    def cards(self, dataset: EpisodeDataset) -> list[dict]:
        """The report's card of every scored task (evaluation/report.py), in the evaluation set's order."""
        return task_cards(self.attempts, self.records, self.seconds, self.ttt_steps, dataset, self.losses)

    def images(self, dataset: EpisodeDataset) -> list[tuple[str, np.ndarray]]:
        """(task id, [H, W, 3] uint8) of the first IMAGES scored tasks in the evaluation set's order
        (the same tasks at every validation: its first tasks are scored first), grids labelled."""
        first: dict[str, int] = {}
        for i in sorted(self.attempts):
            first.setdefault(dataset.episodes[i].task.task_id, i)
        images = []
        for task_id, i in list(first.items())[:IMAGES]:
            ep = dataset.episodes[i]  # the target is drawn after scoring, beside the attempts
            images.append((task_id, task_image(ep.task.train, ep.query.input, ep.query.output, self.attempts[i])))
        return images

    def metrics(self, prefix: str, cfg: Config) -> dict[str, float]:
        """`<prefix>/*`: ARC Prize metrics with the 95% interval over tasks of pass2, exact, oracle and
        task_score (`_lo`, `_hi`; evaluation/intervals.py), the held-out loss after adaptation
        (`adapted_nats_cell`, `adapted_bits_grid`, with theirs), the copy baseline as `<prefix>/copy_*`,
        tasks, seconds a task and (with test-time training) its steps a task; `pairs` (the test inputs
        the scores are means over: those with a known output) and `unanswered` (the others)."""
        records = list(self.records.values())
        out = {f"{prefix}/{k}": v for k, v in summarise(records).items()}
        for name in INTERVALS:
            source, per = ("pass2", "task") if name == "task_score" else (name, "pair")  # task score: solved pairs
            if records and source in records[0][1]:
                lo, hi = interval([(t, m[source]) for t, m in records], per)
                out.update({f"{prefix}/{name}_lo": lo, f"{prefix}/{name}_hi": hi})
        out.update({f"{prefix}/{k}": v for k, v in loss_metrics(self.losses, "adapted").items()})
        out.update({f"{prefix}/copy_{k}": v for k, v in summarise(list(self.copy_records.values())).items()
                    if k != "oracle"})
        out[f"{prefix}/pairs"] = float(len(records))
        out[f"{prefix}/unanswered"] = float(len(self.unanswered))
        out[f"{prefix}/seconds_per_task"] = float(np.mean(list(self.seconds.values())))
        out[f"{prefix}/tasks"] = float(len(self.seconds))
        if cfg.eval.ttt_steps:
            out[f"{prefix}/ttt_steps_per_task"] = float(np.mean(list(self.ttt_steps.values())))
        return out
