"""Episodes (context demos + one query pair) and the tensors a training step consumes.

Training episodes: leave-one-out over the demos of every training task plus its test pairs with all
demos as context; evaluation episodes: the test pairs of evaluation tasks (README "Data"). The query
output never reaches the prompt, and an evaluation sample carries no target (docs/invariants.md #8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from data.arc import MAX_SIDE, ArcPair, ArcTask
from data.augment import Augmentation, view_ids
from data.canvas import PAD, encode, expected_extent, fit_side
from data.curriculum import EASY_PERCENTILE
from data.enclosed import enclosed_map
from data.features import COOC_AT, HIST_AT, RELATION_DIM, difficulty, numeric_features, relation_features
from data.text import demo_text
from data.view_batch import ViewSet, colour_index

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


CANVAS_MODES = ("fit", "bucket", "full")
# --canvas bucket's sides: a handful of shapes for a compiled agent (docs/model.md, "Models")
CANVAS_BUCKETS = (8, 12, 16, 20, 25, 30)


def bucket_side(side: int) -> int:
    """The smallest of CANVAS_BUCKETS that holds `side` (<= 30)."""
    return min(b for b in CANVAS_BUCKETS if side <= b)


def episode_extent(ep: Episode, fit_target: bool) -> int:
    """The largest grid side of an episode (see data/canvas.py): predicted from the context and the
    query input; with `fit_target` (training episodes, whose target is the loss) widened to the target's."""
    extent = expected_extent(ep.context, ep.query.input)
    return max(extent, *ep.query.output.shape) if fit_target and ep.query.answered else extent


# (episode, augmentation) samples whose prompt features and demo texts a dataset keeps (about 600
# bytes and 1 KB each on ARC-AGI-1): with --augment_pool a run meets each again every few epochs, and
# computing them (the features, and augmenting every context grid) was most of a sample's cost
# (bench.step_profile)
FEATURE_CACHE = 1 << 16


class EpisodeDataset(Dataset):
    """Indexed by (episode index, augmentation id); id 0 is the identity (see Augmentation.from_id)."""

    def __init__(self, episodes: list[Episode], scale: DifficultyScale, *,
                 scores: np.ndarray | None = None, canvas: str = "fit", fit_target: bool = True,
                 task_rows: dict[str, int] | None = None):
        """`scores`: the episodes' difficulty scores when already computed (they are not cheap).
        `canvas`: "fit" cuts each batch to the side its episodes need, "bucket" to the smallest of
        CANVAS_BUCKETS holding it, "full" keeps 30x30.
        `fit_target`: False for evaluation episodes, whose side must not depend on their output and
        whose samples carry no target at all (docs/invariants.md #8).
        `task_rows`: task id -> row of the model's task embedding (-1 for a task without one)."""
        if canvas not in CANVAS_MODES:
            raise ValueError(f"canvas={canvas!r}: choose one of {', '.join(CANVAS_MODES)}")
        self.episodes, self.scale, self.canvas = episodes, scale, canvas
        self.fit_target = fit_target
        self.task_rows = task_rows or {}
        self.scores = scores if scores is not None else np.array([episode_difficulty(e) for e in episodes])
        self.extents = np.array([episode_extent(e, fit_target) for e in episodes], dtype=np.int64)
        # the canvas side of each episode's samples, under any view (what batches are bucketed by)
        self.sides = np.array([self._cut(fit_side((x,))) for x in self.extents], dtype=np.int64)
        # features by (episode, dihedral), a sample's features and texts by (episode, view id), view sets
        # by (demos, side, views): see view_features, described, view_set
        self._described: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._samples: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]] = {}
        self._view_sets: dict[tuple[int, int, int], ViewSet] = {}

    def __len__(self) -> int:
        return len(self.episodes)

    def _cut(self, side: int) -> int:
        """The canvas side of a sample whose grids need `side`."""
        return {"fit": side, "bucket": bucket_side(side), "full": MAX_SIDE}[self.canvas]

    def __getitem__(self, item: tuple[int, int]) -> dict:
        index, aug_id = item
        ep = self.episodes[index]
        aug = Augmentation.from_id(aug_id, len(ep.context))
        query_in = aug.grid(ep.query.input)
        side = int(self.sides[index])
        percentile = self.scale.percentile(self.scores[index])
        ctrl = [percentile, float(self.scale.is_easy(self.scores[index])), float(not aug.is_identity)]
        numeric, relation, demo_texts = self.described(index, aug)
        sample = {
            "input": torch.from_numpy(encode(query_in)),
            "numeric": numeric,
            "relation": relation,
            "ctrl": torch.tensor(ctrl, dtype=torch.float32),
            "side": side,
            "demo_texts": demo_texts,
            "task_id": ep.task.task_id,
            "task_row": self.task_rows.get(ep.task.task_id, -1),
            "episode": index,
            "where": ep.where,
            "augmentation": aug,
        }
        if self.fit_target:  # a loss's: training, held-out and demo episodes; a test input without a known
            # output (a task to predict) gets a target of PAD only, which no loss counts
            sample["target"] = torch.from_numpy(encode(aug.grid(ep.query.output)) if ep.query.answered
                                                else np.full((MAX_SIDE,) * 2, PAD, dtype=np.int64))
        return sample

    def described(self, index: int, aug: Augmentation) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
        """What the prompt reads of sample (index, aug.aug_id): its numeric [15] and relation [129]
        float32 features (`view_features`) and its context's demo texts (`demo_texts`); kept for the
        next draw of the same sample (up to FEATURE_CACHE, the oldest dropped first), so a sample drawn
        again costs a lookup. Shared by every draw: read, never written."""
        key = (index, aug.aug_id)
        if key not in self._samples:
            if len(self._samples) >= FEATURE_CACHE:
                del self._samples[next(iter(self._samples))]
            numeric, relation = self.view_features(index, ViewSet.of([aug], [0]))
            self._samples[key] = (numeric[0], relation[0], self.demo_texts(index, aug))
        return self._samples[key]

    def view_features(self, index: int, views: ViewSet) -> tuple[torch.Tensor, torch.Tensor]:
        """The numeric [V, 15] and relation [V, 129] float32 features of episode `index` under each of
        `views`, of its augmented context and query input (data/features.py).

        Computed once per dihedral transform and kept (up to FEATURE_CACHE, the oldest dropped first):
        the features of the same grids under a renaming of the colours that keeps 0 (every view's:
        data.augment.Augmentation.from_id) are these, the colour-indexed relation features permuted
        (`colour_index`), the rest unchanged; the demos are read in the task's order (a mean over
        demos does not depend on their order). Shared by every draw: read, never written."""
        if bool((views.inverse[:, 0] != 0).any()):
            raise ValueError("view_features: every view must keep colour 0 (the features are computed per dihedral)")
        dihedrals = sorted(set(views.dihedral.tolist()))
        base = [self._base_features(index, k) for k in dihedrals]
        which = torch.tensor([dihedrals.index(k) for k in views.dihedral.tolist()], dtype=torch.int64)
        numeric = torch.stack([n for n, _ in base])[which]
        relation = torch.stack([r for _, r in base])[which]
        return numeric, relation.gather(1, colour_index(views.inverse, COOC_AT, HIST_AT, RELATION_DIM))

    def _base_features(self, index: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Episode `index`'s features under dihedral `k`, its colours as they are."""
        key = (index, k)
        if key not in self._described:
            if len(self._described) >= FEATURE_CACHE:
                del self._described[next(iter(self._described))]
            aug = Augmentation(dihedral=k)
            ep = self.episodes[index]
            context = aug.grids_only(ep.context)
            self._described[key] = (torch.from_numpy(numeric_features(context, aug.grid(ep.query.input))),
                                    torch.from_numpy(relation_features(context)))
        return self._described[key]

    def demo_texts(self, index: int, aug: Augmentation) -> tuple[str, ...]:
        """The Qwen stream's texts of sample (index, aug.aug_id): its augmented context demos, in the
        view's order (`described` keeps them with the sample's features)."""
        return tuple(demo_text(p) for p in aug.pairs(self.episodes[index].context))

    def view_set(self, index: int, views: int) -> ViewSet:
        """The first `views` evaluation views of episode `index` (data.augment.view_ids) as the dataset
        draws them, with their canvas sides (the episode's): built once for every episode of the same
        demo count and side (what a view's augmentation and side depend on)."""
        ep = self.episodes[index]
        key = (len(ep.context), int(self.sides[index]), views)
        if key not in self._view_sets:
            ids = view_ids(views)
            augs = [Augmentation.from_id(a, len(ep.context)) for a in ids]
            self._view_sets[key] = ViewSet.of(augs, [int(self.sides[index])] * len(ids))
        return self._view_sets[key]


def with_enclosed(sample: dict) -> dict:
    """The sample with the enclosed-background map of its input canvas (`input_enclosed` [S, S]
    bool): for a sample drawn again and again, as a task's adaptation draws its demo episodes,
    computed once (data.demo_episodes)."""
    return {**sample, "input_enclosed": enclosed_map(sample["input"][None])[0]}


def _enclosed(samples: list[dict], side: int, inputs: torch.Tensor) -> torch.Tensor:
    """The batch's input_enclosed map of its cut `inputs`: the samples' own cut to `side` where
    every sample carries one (`with_enclosed`: a grid and its markers fit the cut, so its edge is
    the same), else computed on the host (data/enclosed.py)."""
    if not all("input_enclosed" in s for s in samples):
        return enclosed_map(inputs)
    return torch.stack([s["input_enclosed"][:side, :side] for s in samples])


def collate(samples: list[dict], side: int | None = None) -> dict:
    """Stack a list of samples into a batch, its canvases cut to `side`, by default the largest
    side S among them (a larger one: the samples' canvases hold it).

    Returns: input [B, S, S] int64 (S <= 30), and target
    [B, S, S] int64 where the samples carry one (not an evaluation set's);
    input_enclosed [B, S, S] bool (the input's enclosed background, data/enclosed.py);
    numeric [B, 15], relation [B, 129], ctrl [B, 3]
    float32; task_row [B] int64 (-1: no task embedding); demo_texts list of B tuples of str;
    task_id, episode, where, augmentation lists of length B.
    An evaluation sample carries no target (its side is predicted without it); scoring reads the grids.
    """
    side = side or max(s["side"] for s in samples)
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("numeric", "relation", "ctrl")}
    batch["task_row"] = torch.tensor([s["task_row"] for s in samples], dtype=torch.int64)
    batch["dihedral"] = torch.tensor([s["augmentation"].dihedral for s in samples], dtype=torch.int64)
    for k in ("input", "target") if "target" in samples[0] else ("input",):
        batch[k] = torch.stack([s[k][:side, :side] for s in samples])
    batch["input_enclosed"] = _enclosed(samples, side, batch["input"])
    for k in ("demo_texts", "task_id", "episode", "where", "augmentation"):
        batch[k] = [s[k] for s in samples]
    return batch


def pad_rows(batch: dict, size: int) -> dict:
    """A collated batch of B <= `size` samples with its first sample repeated to `size` rows, every
    tensor and list of B rows so grown (the rows past B are to be dropped from what the model returns):
    a compiled model sees one batch size, not a second graph for a last, shorter batch."""
    rows = len(batch["episode"])
    if rows >= size:
        return batch
    out = {}
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() and value.shape[0] == rows:
            out[key] = torch.cat([value, value[:1].expand(size - rows, *value.shape[1:])])
        elif isinstance(value, list) and len(value) == rows:
            out[key] = value + value[:1] * (size - rows)
        else:
            out[key] = value
    return out
