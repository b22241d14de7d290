"""Episodes (context demos + one query pair) and the tensors a training step consumes.

Training episodes: leave-one-out over the demos of every training task (one demo is the query, the
others the context) plus the test pairs of training tasks with all demos as context. Evaluation
episodes: the test pairs of evaluation tasks; their outputs are read by the scorer only.

Everything the prompt sees (demo texts, numeric and relation features, control vector) is computed
from the context demos and the query INPUT; the query output only becomes the training target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from data.arc import MAX_SIDE, ArcPair, ArcTask
from data.augment import Augmentation
from data.canvas import encode, expected_side, fit_side
from data.curriculum import EASY_PERCENTILE
from data.features import difficulty, numeric_features, relation_features
from data.text import demo_text

CTRL_FEATURES = (
    "difficulty_percentile",  # the episode's difficulty rank among training episodes, in [0, 1]
    "is_easy",  # 1 if below the easy percentile of the curriculum
    "is_augmented",  # 1 if the episode was augmented
)
CTRL_DIM = len(CTRL_FEATURES)


@dataclass(frozen=True)
class Episode:
    task: ArcTask
    context: tuple[ArcPair, ...]
    query: ArcPair
    where: str  # "train[i]" or "test[j]": which pair of the task is the query


def training_episodes(tasks: tuple[ArcTask, ...]) -> list[Episode]:
    episodes = []
    for task in tasks:
        if len(task.train) >= 2:
            for i, pair in enumerate(task.train):
                episodes.append(Episode(task, task.train[:i] + task.train[i + 1:], pair, f"train[{i}]"))
        for j, pair in enumerate(task.test):
            episodes.append(Episode(task, task.train, pair, f"test[{j}]"))
    return episodes


def evaluation_episodes(tasks: tuple[ArcTask, ...]) -> list[Episode]:
    return [Episode(t, t.train, p, f"test[{j}]") for t in tasks for j, p in enumerate(t.test)]


class DifficultyScale:
    """Maps a difficulty score to its percentile among the training episodes."""

    def __init__(self, train_scores: np.ndarray):
        self.sorted = np.sort(train_scores)

    def percentile(self, score: float) -> float:
        return float(np.searchsorted(self.sorted, score, side="left")) / max(len(self.sorted), 1)

    def is_easy(self, score: float) -> bool:
        return self.percentile(score) < EASY_PERCENTILE / 100


def episode_difficulty(ep: Episode) -> float:
    return difficulty(ep.context, ep.query.input)


CANVAS_MODES = ("fit", "full")


def episode_side(ep: Episode, fit_target: bool) -> int:
    """Canvas side of an episode (see data/canvas.py): predicted from the context and the query
    input; with `fit_target` (training episodes, whose target is the loss) widened to hold the target."""
    side = expected_side(ep.context, ep.query.input)
    return max(side, fit_side(ep.query.output.shape)) if fit_target else side


class EpisodeDataset(Dataset):
    """Indexed by (episode index, augmentation id); id 0 is the identity (see Augmentation.from_id)."""

    def __init__(self, episodes: list[Episode], scale: DifficultyScale, *, permute_background: bool = False,
                 scores: np.ndarray | None = None, canvas: str = "fit", fit_target: bool = True,
                 task_rows: dict[str, int] | None = None, context_demos: int = 0):
        """`scores`: the episodes' difficulty scores when already computed (they are not cheap).
        `canvas`: "fit" cuts each batch to the side its episodes need, "full" keeps 30x30.
        `fit_target`: False for evaluation episodes, whose side must not depend on their output.
        `task_rows`: task id -> row of the model's task embedding (-1 for a task without one).
        `context_demos`: each sample also carries up to this many of its (augmented) context demos
        as grids, for a model's latent step (prompt/latent_step.py); they fit the episode's side."""
        if canvas not in CANVAS_MODES:
            raise ValueError(f"canvas={canvas!r}: choose one of {', '.join(CANVAS_MODES)}")
        self.episodes, self.scale, self.canvas = episodes, scale, canvas
        self.permute_background, self.context_demos = permute_background, context_demos
        self.task_rows = task_rows or {}
        self.scores = scores if scores is not None else np.array([episode_difficulty(e) for e in episodes])
        self.sides = np.array([episode_side(e, fit_target) if canvas == "fit" else MAX_SIDE for e in episodes],
                              dtype=np.int64)

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, item: tuple[int, int]) -> dict:
        index, aug_id = item
        ep = self.episodes[index]
        aug = Augmentation.from_id(aug_id, len(ep.context), self.permute_background)
        context = aug.pairs(ep.context)
        query_in, query_out = aug.grid(ep.query.input), aug.grid(ep.query.output)
        percentile = self.scale.percentile(self.scores[index])
        ctrl = [percentile, float(self.scale.is_easy(self.scores[index])), float(not aug.is_identity)]
        sample = {
            "input": torch.from_numpy(encode(query_in)),
            "target": torch.from_numpy(encode(query_out)),
            "numeric": torch.from_numpy(numeric_features(context, query_in)),
            "relation": torch.from_numpy(relation_features(context)),
            "ctrl": torch.tensor(ctrl, dtype=torch.float32),
            "side": int(self.sides[index]),
            "demo_texts": tuple(demo_text(p) for p in context),
            "task_id": ep.task.task_id,
            "task_row": self.task_rows.get(ep.task.task_id, -1),
            "episode": index,
            "where": ep.where,
            "augmentation": aug,
        }
        if self.context_demos:
            demos = context[:self.context_demos]
            sample["context_input"] = _canvases([p.input for p in demos])
            sample["context_target"] = _canvases([p.output for p in demos])
        return sample


def _canvases(grids: list) -> torch.Tensor:
    """Grids -> their canvases [n, 30, 30] int64 (n may be 0)."""
    canvases = np.empty((len(grids), MAX_SIDE, MAX_SIDE), dtype=np.int64)
    for i, grid in enumerate(grids):
        canvases[i] = encode(grid)
    return torch.from_numpy(canvases)


def collate(samples: list[dict]) -> dict:
    """Stack a list of samples into a batch, its canvases cut to the largest side S among them.

    Returns: input, target [B, S, S] int64; numeric [B, 15], relation [B, 129], ctrl [B, 3]
    float32; task_row [B] int64 (-1: no task embedding); demo_texts list of B tuples of str;
    task_id, episode, where, augmentation lists of length B; with context demos (EpisodeDataset's
    `context_demos`), context_input, context_target [N, S, S] int64 and context_owner [N] int64
    (the sample each of the N demos belongs to, in sample order).
    An evaluation target can be cut by S (its side is predicted without it); scoring reads the grids.
    """
    side = max(s["side"] for s in samples)
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("numeric", "relation", "ctrl")}
    batch["task_row"] = torch.tensor([s["task_row"] for s in samples], dtype=torch.int64)
    batch["dihedral"] = torch.tensor([s["augmentation"].dihedral for s in samples], dtype=torch.int64)
    batch["colours"] = torch.tensor([s["augmentation"].colours for s in samples], dtype=torch.int64)
    for k in ("input", "target"):
        batch[k] = torch.stack([s[k][:side, :side] for s in samples])
    for k in ("demo_texts", "task_id", "episode", "where", "augmentation"):
        batch[k] = [s[k] for s in samples]
    if "context_input" in samples[0]:
        for k in ("context_input", "context_target"):
            batch[k] = torch.cat([s[k][:, :side, :side] for s in samples])
        batch["context_owner"] = torch.cat([torch.full((len(s["context_input"]),), i, dtype=torch.int64)
                                            for i, s in enumerate(samples)])
    return batch
