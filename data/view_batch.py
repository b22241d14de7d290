"""A test input's views as one batch of tensors: built with index tensors, not a sample at a time.

Scoring votes over hundreds of views of each test input (`--eval_augments`). Built one sample at a
time (`EpisodeDataset[(episode, view)]`, then `collate`) a view costs about 1.5 ms of host work: its
features, its canvas, its inverse later; the model's forward of it costs far less on a GPU. Here a
test input's views are a `ViewSet` (their augmentations as tensors, built once for every episode of
the same demo count and side), its canvases are gathered from the grid through the dihedral maps
below (`encode_views`), its features are its task's, computed once a dihedral transform and
background colour and permuted for the view's colours (EpisodeDataset.view_features), and the batch
is what `collate` would stack of the same samples (tests/test_view_batch.py checks it key by key).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from data.arc import NUM_COLOURS
from data.augment import Augmentation
from data.canvas import EOG, PAD
from data.enclosed import enclosed_map


def swaps_shape(k: torch.Tensor) -> torch.Tensor:
    """k [...] int64 dihedral indices (data.augment.dihedral) -> [...] bool: the transform turns an
    h x w grid into a w x h one (an odd number of quarter turns, or a transpose, not both)."""
    return (k % 2 == 1) ^ (k >= 4)


def task_cell(k: torch.Tensor, h: torch.Tensor, w: torch.Tensor, a: torch.Tensor,
              b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where view-frame cell (a, b) of `dihedral(grid, k)` comes from in the grid, whose task-frame
    shape is (h, w): -> (i, j). All arguments int64 tensors that broadcast together.

    dihedral(G, k) turns G k % 4 quarter turns (numpy's rot90, counter-clockwise), then transposes
    when k >= 4; undone in the reverse order."""
    x, y = torch.where(k >= 4, b, a), torch.where(k >= 4, a, b)  # the cell before the transpose
    r = k % 4  # rot90 once: R[x, y] = G[y, w-1-x]; twice: G[h-1-x, w-1-y]; three times: G[h-1-y, x]
    i = torch.where(r == 0, x, torch.where(r == 1, y, torch.where(r == 2, h - 1 - x, h - 1 - y)))
    j = torch.where(r == 0, y, torch.where(r == 1, w - 1 - x, torch.where(r == 2, w - 1 - y, x)))
    return i, j


def view_cell(k: torch.Tensor, h: torch.Tensor, w: torch.Tensor, i: torch.Tensor,
              j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `task_cell`: task-frame cell (i, j) of an h x w grid -> (a, b), where it lies in
    `dihedral(grid, k)`."""
    r = k % 4
    x = torch.where(r == 0, i, torch.where(r == 1, w - 1 - j, torch.where(r == 2, h - 1 - i, j)))
    y = torch.where(r == 0, j, torch.where(r == 1, i, torch.where(r == 2, w - 1 - j, h - 1 - i)))
    return torch.where(k >= 4, y, x), torch.where(k >= 4, x, y)


@dataclass(frozen=True)
class ViewSet:
    """V views of an episode, the identity first (data.augment.view_ids), as the dataset draws them:
    `augmentations`, and the same as int64 tensors on the CPU: dihedral [V], colours [V, 10]
    (colours[v, c]: the new colour of c), inverse [V, 10] (its inverse permutation), side [V] (the
    canvas side a sample of the view needs), and augmented [V] float32 (1: not the identity, the
    ctrl feature)."""

    augmentations: tuple[Augmentation, ...]
    dihedral: torch.Tensor
    colours: torch.Tensor
    inverse: torch.Tensor
    side: torch.Tensor
    augmented: torch.Tensor

    @classmethod
    def of(cls, augmentations: list[Augmentation], sides: list[int]) -> ViewSet:
        colours = torch.tensor([a.colours for a in augmentations], dtype=torch.int64)
        return cls(tuple(augmentations), torch.tensor([a.dihedral for a in augmentations], dtype=torch.int64),
                   colours, colours.argsort(1), torch.tensor(sides, dtype=torch.int64),
                   torch.tensor([float(not a.is_identity) for a in augmentations], dtype=torch.float32))

    def __len__(self) -> int:
        return len(self.augmentations)

    def part(self, lo: int, hi: int) -> ViewSet:
        """Views lo..hi-1."""
        return ViewSet(self.augmentations[lo:hi], *(t[lo:hi] for t in (
            self.dihedral, self.colours, self.inverse, self.side, self.augmented)))

    @staticmethod
    def cat(parts: list[ViewSet]) -> ViewSet:
        return ViewSet(tuple(a for p in parts for a in p.augmentations), *(torch.cat(ts) for ts in zip(*(
            (p.dihedral, p.colours, p.inverse, p.side, p.augmented) for p in parts), strict=True)))


def encode_views(grid: np.ndarray, views: ViewSet, side: int) -> torch.Tensor:
    """One grid [h, w] int64 (task frame) under every view -> canvases [V, side, side] int64: what
    `data.canvas.encode(view.grid(grid), side)` gives each view (the grid at the top-left, its
    end-of-grid markers, PAD beyond)."""
    g = torch.from_numpy(np.ascontiguousarray(grid))
    h, w = g.shape
    k = views.dihedral[:, None, None]
    turned = swaps_shape(k)
    vh, vw = torch.where(turned, w, h), torch.where(turned, h, w)  # the view-frame shape
    p, q = torch.arange(side)[None, :, None], torch.arange(side)[None, None, :]
    inside = (p < vh) & (q < vw)
    i, j = task_cell(k, torch.tensor(h), torch.tensor(w), p, q)
    cells = g[i.clamp(0, h - 1), j.clamp(0, w - 1)]  # [V, side, side], read only where inside
    values = views.colours.gather(1, cells.reshape(len(views), -1)).view_as(cells)
    eog = end_markers(p, q, vh, vw)
    return torch.where(inside, values, torch.where(eog, torch.tensor(EOG), torch.tensor(PAD)))


def end_markers(p: torch.Tensor, q: torch.Tensor, bottom: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Whether canvas cell (p, q) holds an end-of-grid marker of a grid at the top-left whose cells
    end at row `bottom` and column `right` (data.canvas.encode's markers: the column right of the
    grid and the row below it, their corner included). Broadcasting int64 tensors -> bool."""
    return ((q == right) & (p <= bottom)) | ((p == bottom) & (q <= right))


def view_batch(dataset, segments: list[tuple[int, ViewSet]], texts: bool = True) -> dict:
    """The batch `collate([dataset[(e, a)] for each segment (e, views) for a in views])` gives, built
    a segment at a time with tensors (an evaluation set's: no target).

    dataset: an EpisodeDataset (fit_target False); segments: (episode index, some of its views), in
    the batch's order. texts: the demo texts (read by a Qwen stream only; without one the batch
    carries empty tuples). -> the batch (data.episodes.collate's keys and shapes)."""
    side = max(int(v.side.max()) for _, v in segments)
    inputs, numeric, relation, ctrl, rows, names = [], [], [], [], [], {k: [] for k in (
        "demo_texts", "task_id", "episode", "where", "augmentation")}
    for index, views in segments:
        ep, n = dataset.episodes[index], len(views)
        inputs.append(encode_views(ep.query.input, views, side))
        num, rel = dataset.view_features(index, views)
        numeric.append(num)
        relation.append(rel)
        percentile = dataset.scale.percentile(dataset.scores[index])
        ctrl.append(torch.stack([torch.full((n,), percentile), torch.full((n,), float(
            dataset.scale.is_easy(dataset.scores[index]))), views.augmented], 1))
        rows.append(torch.full((n,), dataset.task_rows.get(ep.task.task_id, -1), dtype=torch.int64))
        names["demo_texts"] += [dataset.described(index, a)[2] for a in views.augmentations] if texts else [()] * n
        names["task_id"] += [ep.task.task_id] * n
        names["episode"] += [index] * n
        names["where"] += [ep.where] * n
        names["augmentation"] += list(views.augmentations)
    views = ViewSet.cat([v for _, v in segments])
    batch = {"numeric": torch.cat(numeric), "relation": torch.cat(relation), "ctrl": torch.cat(ctrl),
             "task_row": torch.cat(rows), "dihedral": views.dihedral,
             "input": torch.cat(inputs), **names}
    batch["input_enclosed"] = enclosed_map(batch["input"])
    return batch


def colour_index(inverse: torch.Tensor, cooc_at: int, hist_at: int, dim: int) -> torch.Tensor:
    """The relation features' index map of a colour renaming that keeps colour 0: inverse [V, 10]
    int64 (the renaming's inverse) -> [V, dim] int64, entry d the feature of the unrenamed vector
    that lands at d (co-occurrences [10 x 10] at `cooc_at`, histogram changes [10] at `hist_at`)."""
    n = inverse.shape[0]
    index = torch.arange(dim).expand(n, -1).clone()
    index[:, cooc_at: cooc_at + NUM_COLOURS ** 2] = cooc_at + (
        inverse[:, :, None] * NUM_COLOURS + inverse[:, None, :]).reshape(n, -1)
    index[:, hist_at: hist_at + NUM_COLOURS] = hist_at + inverse
    return index
