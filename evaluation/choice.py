"""What the attempt chooser reads of one test input's candidates, and the two attempts it picks.

Every candidate is described by FEATURES, from its votes and log-probabilities under the views and
from the task's demos and test input (never a test output): the learned chooser
(policy_refined.AttemptChooser, `--attempt_ranking learned`) scores these rows and takes its two best.
"""

from __future__ import annotations

import numpy as np

from data.arc import ArcPair, Grid
from evaluation.scoring import Candidates

FLOOR = -20.0  # nats a view: where a log-probability feature stops (a view that cannot hold the grid gives -inf)
FEATURES = (
    "vote_share",  # votes / views (0 for a proposed grid)
    "votes_rank",  # 1 / (1 + rank under the votes' ranking)
    "logprob_gap",  # (view-summed log-probability - the best candidate's) / views, >= FLOOR
    "logprob_rank",  # 1 / (1 + rank under the summed log-probability)
    "cell_logprob",  # view-summed log-probability / (views x cells), >= FLOOR
    "proposed",  # 1: no view predicted it (enumerated, Candidates.propose_likely)
    "shape_follows",  # 1: its shape follows the demos' output shapes (same as the input, one fixed shape or a
    #                   fixed ratio to the input), 0: it breaks the rule they follow, 0.5: they follow none
    "colours_known",  # share of its cells in colours of the test input or of a demo output
    "is_input",  # 1: it copies the test input
    "differs_from_first",  # share of its cells that differ from the votes' first (1 when the shapes differ)
    "candidates",  # log(1 + number of candidates)
)


def expected_shapes(demos: tuple[ArcPair, ...], query: Grid) -> set[tuple[int, int]] | None:
    """Output shapes the demos' pattern allows for `query`: the input's shape when every demo keeps
    it, the one shape every demo output has, the input's shape times the demos' fixed ratio; None
    when the demos follow none of these."""
    shapes: set[tuple[int, int]] = set()
    ins, outs = [p.input.shape for p in demos], [p.output.shape for p in demos]
    if all(i == o for i, o in zip(ins, outs, strict=True)):
        shapes.add(query.shape)
    if len(set(outs)) == 1:
        shapes.add(outs[0])
    ratios = {(o[0] / i[0], o[1] / i[1]) for i, o in zip(ins, outs, strict=True)}
    if len(ratios) == 1:
        (ry, rx), = ratios
        h, w = query.shape[0] * ry, query.shape[1] * rx
        if h.is_integer() and w.is_integer():
            shapes.add((int(h), int(w)))
    return shapes or None


def candidate_features(cands: Candidates, demos: tuple[ArcPair, ...], query: Grid) -> tuple[list[Grid], np.ndarray]:
    """-> (the candidates in the votes' order, their features [N, len(FEATURES)] float32).

    demos: the task's demo pairs; query: the test input [h, w] int64. Reads no test output."""
    grids = cands.ranked("votes")
    views = max(len(cands.views), 1)
    by_key = cands.view_scores()
    scores = np.array([by_key[Candidates.key(g)] for g in grids])
    by_logprob = {Candidates.key(g): r for r, g in enumerate(cands.ranked("logprob"))}
    shapes = expected_shapes(demos, query)
    known = np.zeros(10, bool)
    for grid in (query, *(p.output for p in demos)):
        known[np.unique(grid)] = True
    first = grids[0]
    rows = []
    for rank, (grid, score) in enumerate(zip(grids, scores, strict=True)):
        key = Candidates.key(grid)
        gap = (score - scores.max()) / views if np.isfinite(score) else FLOOR
        rows.append([
            cands.votes.get(key, 0) / views,
            1 / (1 + rank),
            max(gap, FLOOR),
            1 / (1 + by_logprob[key]),
            max(score / (views * grid.size), FLOOR) if np.isfinite(score) else FLOOR,
            float(key in cands.proposed),
            0.5 if shapes is None else float(grid.shape in shapes),
            float(known[grid].mean()),
            float(grid.shape == query.shape and (grid == query).all()),
            float((grid != first).mean()) if grid.shape == first.shape else 1.0,
            float(np.log1p(len(grids))),
        ])
    return grids, np.asarray(rows, dtype=np.float32)


def learned_attempts(chooser, cands: Candidates, demos: tuple[ArcPair, ...], query: Grid) -> tuple[Grid, Grid]:
    """The two candidates `chooser` (policy_refined.AttemptChooser) scores best, the better first."""
    grids, features = candidate_features(cands, demos, query)
    first, second = chooser.best_two(features)
    return grids[first], grids[second]
