"""bench/rankings.py: its record of a test input's views agrees with the candidates the suite votes over,
and each ranking orders candidates as its docstring says."""

import numpy as np
import torch

from bench.rankings import RANKINGS, pair_record, pass2
from data.augment import Augmentation, view_ids
from data.view_batch import ViewSet
from evaluation.scoring import Candidates
from evaluation.view_votes import ViewLogp, decode_views, task_frame


def test_the_record_of_views_is_the_candidates_votes_and_the_votes_ranking_is_the_suites():
    """16 views of a test input in two batches of canvas sides 5 and 8 (the first padded to 8 in the
    views' stack), some views the same prediction: each view's candidate in the record counts to the
    candidates' votes, and the votes' ranking over all views is Candidates.ranked."""
    torch.manual_seed(0)
    augs = [Augmentation.from_id(a, 2) for a in view_ids(16)]
    parts = []
    for lo, side in ((0, 5), (8, 8)):
        views = ViewSet.of(augs[lo:lo + 8], [side] * 8)
        logits = torch.randn(8, side, side, 12)
        logits[::2, :, :, 3] += 4.0  # half the views agree on colour 3 (in their own frame)
        logp = torch.log_softmax(logits, -1)
        grids, shapes, mean = decode_views(logp)
        parts.append((ViewLogp(logp, views, torch.full((8,), side)), *task_frame(grids, shapes, views), mean))
    stack = ViewLogp.cat([p[0] for p in parts])
    cands = Candidates.from_views(stack, *(torch.cat([p[k] for p in parts]) for k in (1, 2, 3)))
    target = next(iter(cands.grids.values()))
    record = pair_record(cands, target)
    keys = list(cands.grids)
    assert [int((record["view"] == c).sum()) for c in range(len(keys))] == [cands.votes[k] for k in keys]
    assert record["logprob"].shape == (len(keys), 16) and sum(record["correct"]) == 1
    ranked = [Candidates.key(g) for g in cands.ranked()]
    assert [keys[c] for c in RANKINGS["votes"](record, 16)] == ranked


def test_each_ranking_orders_the_candidates_of_the_first_n_views():
    """Three candidates: 0 holds most votes, 1 the highest summed log-probability, 2 the best a cell;
    over the first two views only candidates 0 and 1 are proposed."""
    record = {"view": np.array([0, 1, 0, 2]), "mean": np.array([-0.5, -0.1, -0.5, -0.2]),
              "logprob": np.array([[-9.0, -9.0, -9.0, -9.0], [-4.0, -4.0, -4.0, -4.0], [-6.0, -6.0, -6.0, -6.0]]),
              "cells": np.array([[9, 9, 9, 9], [2, 2, 2, 2], [12, 12, 12, 12]]), "correct": [False, True, False]}
    assert RANKINGS["votes"](record, 4)[0] == 0
    assert RANKINGS["summed"](record, 4) == [1, 2, 0]
    assert RANKINGS["per-cell"](record, 4) == [2, 0, 1]
    assert RANKINGS["hedged"](record, 4) == [0, 1]
    assert RANKINGS["votes-then-summed"](record, 4) == [0, 1, 2]
    assert RANKINGS["summed"](record, 2) == [1, 0]
    records = [("t", record)]
    assert pass2(records, RANKINGS["hedged"], 4) == {("t", 0): 1.0}
    assert pass2(records, RANKINGS["per-cell"], 4) == {("t", 0): 0.0}
