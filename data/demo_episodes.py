"""The episodes per-task adaptation trains on: augmented leave-one-out episodes of a task's DEMOS
only (one demo the query, the others the context), under a fixed set of views; the task's test
outputs are never read (evaluation/adaptation.py)."""

from __future__ import annotations

import zlib

import numpy as np
import torch

from data.arc import ArcTask
from data.augment import view_ids
from data.episodes import EpisodeDataset, collate, training_episodes, with_enclosed


class DemoEpisodes:
    """Augmented leave-one-out episodes of several tasks' demos; each sample is computed once (the
    pool is finite: episodes x `views`). A batch is cut to the largest side of its tasks' pools
    (`sides`), whichever episodes it draws: a task's batches all have one shape, so its adaptation
    is the same alone or beside others of its side (evaluation/task_batch.py), and a compiled agent
    sees one shape a task."""

    def __init__(self, tasks: list[ArcTask], eval_set: EpisodeDataset, seed: int, views: int):
        self.episodes = [training_episodes((ArcTask(t.task_id, t.train, ()),)) for t in tasks]  # demos only
        flat = [ep for eps in self.episodes for ep in eps]
        # demo outputs are known; the task embedding rows are the evaluation set's
        self.dataset = EpisodeDataset(flat, eval_set.scale, canvas=eval_set.canvas, task_rows=eval_set.task_rows)
        self.first = np.cumsum([0] + [len(e) for e in self.episodes])[:-1]
        self.views = view_ids(views)
        self.sides = _pool_sides(self.dataset, [len(e) for e in self.episodes])
        self.seed = [seed, zlib.crc32("|".join(t.task_id for t in tasks).encode())]
        self.restart_draws()
        self.samples: dict[tuple[int, int], dict] = {}

    def restart_draws(self) -> None:
        """Draw from the start of this group's stream again: test-time training sees the same episodes
        whatever the search drew before it."""
        self.rng = np.random.default_rng(self.seed)

    def sample(self, index: int, aug: int) -> dict:
        if (index, aug) not in self.samples:  # with its enclosed maps: every step draws from the same few
            self.samples[(index, aug)] = with_enclosed(self.dataset[(index, aug)])
        return self.samples[(index, aug)]

    def draw(self, rows: dict[int, int], per_row: int) -> tuple[dict, torch.Tensor]:
        """`per_row` random augmented episodes for every adapter row ({row: its task}).
        -> (collated batch, the row of each sample [B] int64)."""
        samples, of = [], []
        for row, task in rows.items():
            for _ in range(per_row):
                i = self.first[task] + int(self.rng.integers(len(self.episodes[task])))
                samples.append(self.sample(int(i), self.views[int(self.rng.integers(len(self.views)))]))
                of.append(row)
        return collate(samples, self.side(rows)), torch.tensor(of)

    def every(self, rows: dict[int, int]) -> tuple[dict, torch.Tensor]:
        """Every leave-one-out episode of each row's task, unaugmented (the demo loss that picks a start)."""
        samples, of = [], []
        for row, task in rows.items():
            for j in range(len(self.episodes[task])):
                samples.append(self.sample(int(self.first[task] + j), self.views[0]))
                of.append(row)
        return collate(samples, self.side(rows)), torch.tensor(of)

    def side(self, rows: dict[int, int]) -> int:
        """The side a batch of these rows' tasks is cut to: the largest of their pools'."""
        return max(self.sides[task] for task in rows.values())


def pool_side(task: ArcTask, eval_set: EpisodeDataset) -> int:
    """The side DemoEpisodes cuts `task`'s batches to (0 for a task of one demo), without computing
    its samples: what tasks adapted together are grouped by (a sample's side is its episode's,
    whatever its view)."""
    episodes = training_episodes((ArcTask(task.task_id, task.train, ()),))
    dataset = EpisodeDataset(episodes, eval_set.scale, canvas=eval_set.canvas,
                             scores=np.zeros(len(episodes)))  # no difficulty scores: only the sides are read
    return _pool_sides(dataset, [len(episodes)])[0]


def _pool_sides(dataset: EpisodeDataset, counts: list[int]) -> list[int]:
    """The largest sample side of each task's pool: its `counts[t]` episodes (consecutive in
    `dataset`, task by task), under any view."""
    firsts = np.cumsum([0, *counts])[:-1]
    return [max((int(dataset.sides[int(first) + j]) for j in range(n)), default=0)
            for first, n in zip(firsts, counts, strict=True)]
