"""Candidates beyond each view's argmax (evaluation/enumeration.py, Candidates.propose_likely)."""

import itertools

import numpy as np
import pytest
import torch

from data.augment import Augmentation
from data.canvas import NUM_CLASSES, NUM_COLOURS, Placement, encode
from engine.config import Config
from engine.errors import ConfigError
from evaluation.enumeration import ALTERNATIVES, best_grids, enumerate_grids, frame_table
from evaluation.scoring import Candidates, grid_logprob
from tests.test_evaluation import eval_setup, run_eval

SIDE = 12
VIEWS = [Augmentation(), Augmentation.from_id(5, 2), Augmentation.from_id(1_000_003, 2),
         Augmentation.from_id(1_000_004, 2).placed(Placement(2, 1, 0)),
         Augmentation.from_id(1_000_005, 2).placed(Placement(1, 3, 2))]


def colour_only_logp(rng) -> np.ndarray:
    """A random [SIDE, SIDE, 12] table whose end-of-grid and padding entries are 0, so that a grid's
    `grid_logprob` is its colour cells alone."""
    logp = rng.normal(size=(SIDE, SIDE, NUM_CLASSES)).astype(np.float32)
    logp[..., NUM_COLOURS:] = 0.0
    return logp


@pytest.mark.parametrize("view", range(len(VIEWS)))
def test_frame_table_reads_a_grid_like_grid_logprob(view):
    """Summed over a grid's cells, a view's table read in the task's frame is the grid's
    log-probability under that view: rotations, colour permutations and placements undone."""
    rng = np.random.default_rng(view)
    aug, logp = VIEWS[view], colour_only_logp(rng)
    for shape in ((3, 4), (4, 3), (1, 5)):
        grid = rng.integers(0, NUM_COLOURS, size=shape)
        table = frame_table(aug, logp, shape)
        read = table[np.arange(shape[0])[:, None], np.arange(shape[1]), grid].sum()
        assert read == pytest.approx(grid_logprob(grid, aug, logp), abs=1e-4)


def test_frame_table_is_none_where_the_canvas_cannot_hold_the_shape():
    logp = np.zeros((SIDE, SIDE, NUM_CLASSES), np.float32)
    assert frame_table(VIEWS[3], logp, (6, 2)) is None  # scale 2 from row 1: 13 rows on a 12 canvas
    assert frame_table(VIEWS[0], logp, (6, 2)) is not None


def brute_force(table: np.ndarray, floor: float) -> list[tuple[float, list]]:
    """Every grid whose cells each take one of their 1 + ALTERNATIVES best colours, by log-probability."""
    h, w, _ = table.shape
    top = np.argsort(-table, axis=-1)[..., : 1 + ALTERNATIVES].reshape(h * w, -1)
    flat = table.reshape(h * w, -1)
    best = flat.max(-1).sum()
    out = []
    for choice in itertools.product(range(1 + ALTERNATIVES), repeat=h * w):
        colours = top[np.arange(h * w), choice]
        score = flat[np.arange(h * w), colours].sum()
        if best - score <= floor + 1e-9:
            out.append((score, colours.reshape(h, w).tolist()))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("seed", range(4))
def test_best_grids_are_the_most_probable_in_order(seed):
    """Against brute force over a 2 x 3 grid: the same grids, best first, none below the floor."""
    table = np.random.default_rng(seed).normal(scale=2.0, size=(2, 3, NUM_COLOURS))
    for k, floor in ((1, 9.0), (12, 9.0), (40, 3.0), (5, 0.0)):
        want = [g for _, g in brute_force(table, floor)][:k]
        assert [g.tolist() for g in best_grids(table, k, floor)] == want, (k, floor)


def near_miss(votes_for_wrong: int) -> tuple[Candidates, np.ndarray, np.ndarray]:
    """Views that all predict `wrong`, which differs from `target` in one cell where every view
    gives the target's colour almost as much weight. -> (candidates, wrong, target)."""
    target = np.array([[1, 2, 3], [4, 5, 6]])
    wrong = target.copy()
    wrong[1, 2] = 7
    cands = Candidates()
    for v in range(votes_for_wrong):
        aug = Augmentation.from_id(v, 1)
        logp = np.full((SIDE, SIDE, NUM_CLASSES), -8.0, np.float32)
        shown = encode(aug.grid(wrong), aug.placement, SIDE)
        rows, cols = np.indices(shown.shape)
        logp[rows, cols, shown] = -0.1
        doubtful = encode(aug.grid(target), aug.placement, SIDE) != shown
        logp[doubtful, aug.colours[6]] = -0.5  # the target's colour there: a close second
        cands.add(wrong, -0.1, aug, logp)  # its prediction, mapped back to the task frame
    return cands, wrong, target


def test_a_one_cell_near_miss_becomes_a_candidate_after_the_voted_ones():
    cands, wrong, target = near_miss(4)
    assert not cands.contains(target)
    cands.propose_likely(k=4, floor=1.0)
    assert cands.contains(target)
    ranked = [g.tolist() for g in cands.ranked("votes")]
    assert ranked[0] == wrong.tolist() and ranked[1] == target.tolist()  # the voted grid, then the likeliest other
    assert [g.tolist() for g in cands.attempts("logprob")] == [wrong.tolist(), target.tolist()]
    strict = near_miss(4)[0]
    strict.propose_likely(k=4, floor=0.3)  # the change costs 0.4 nats a view: below this floor
    assert not strict.contains(target)


def test_enumerate_grids_proposes_each_shape_its_argmax_first():
    rng = np.random.default_rng(0)
    views = [(aug, colour_only_logp(rng)) for aug in VIEWS]
    grids = enumerate_grids(views, [(2, 2), (3, 1)], k=3, floor=50.0)
    assert [g.shape for g in grids] == [(2, 2)] * 3 + [(3, 1)] * 3
    scores = [sum(grid_logprob(g, aug, logp) for aug, logp in views) for g in grids[:3]]
    assert scores == sorted(scores, reverse=True)


def test_enumerate_flags_are_checked():
    with pytest.raises(ConfigError, match="--enumerate must be >= 0"):
        Config.from_flags(enumerate=-1)
    with pytest.raises(ConfigError, match="--enumerate_floor must be >= 0"):
        Config.from_flags(enumerate_floor=-0.5)


def test_enumeration_adds_candidates_and_keeps_the_voted_attempts(small_cfg, tmp_path):
    """A real validation: the oracle can only grow, the votes' attempts stay those of the views."""
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, ttt_steps=0)
    torch.manual_seed(0)
    plain = run_eval(state, eval_set, cfg)
    more = run_eval(state, eval_set, cfg.replace(enumerate=8, enumerate_floor=5.0))
    assert more.metrics["eval/oracle"] >= plain.metrics["eval/oracle"]
    assert more.metrics["eval/pass2_votes"] == plain.metrics["eval/pass2_votes"]
    assert more.submission.keys() == plain.submission.keys()
