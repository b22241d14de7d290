"""The synthetic generator: every family obeys its rule in every pair, seeded, valid, in range."""

import numpy as np
import pytest

from data.arc import ArcTask
from data.sources import load_source
from data.synthetic import FAMILIES, generate_tasks, make_task


def valid(task: ArcTask) -> bool:
    grids = [g for p in task.train + task.test for g in (p.input, p.output)]
    return all(g.dtype == np.int64 and 1 <= min(g.shape) and max(g.shape) <= 30 and 0 <= g.min() and g.max() <= 9
               for g in grids)


def fallen(x, direction: str):
    """Non-background cells of each column (or row) packed against one edge, in their order: the
    gravity rule written out cell by cell, independently of the generator."""
    out = np.zeros_like(x)
    lines = x.T if direction in ("down", "up") else x
    target = out.T if direction in ("down", "up") else out
    for i, line in enumerate(lines):
        cells = [v for v in line if v != 0]
        if direction in ("down", "right"):
            target[i, len(line) - len(cells):] = cells
        else:
            target[i, :len(cells)] = cells
    return out


def enclosed(x):
    """Background cells with no 4-connected path of background to the grid's edge."""
    h, w = x.shape
    reach = np.zeros((h, w), bool)
    frontier = [(r, c) for r in range(h) for c in range(w) if (r in (0, h - 1) or c in (0, w - 1)) and x[r, c] == 0]
    while frontier:
        r, c = frontier.pop()
        if 0 <= r < h and 0 <= c < w and x[r, c] == 0 and not reach[r, c]:
            reach[r, c] = True
            frontier += [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]
    return (x == 0) & ~reach


def cropped(x):
    rows, cols = np.nonzero(x)
    return x[rows.min():rows.max() + 1, cols.min():cols.max() + 1]


def one_colour_map(x, y) -> bool:
    return x.shape == y.shape and all(len(set(y[x == c].tolist())) == 1 for c in np.unique(x))


def ring(y):
    return np.concatenate([y[0], y[-1], y[:, 0], y[:, -1]])


CHECKS = {
    "transpose": lambda x, y: np.array_equal(x.T, y),
    "flip": lambda x, y: np.array_equal(np.flipud(x), y) or np.array_equal(np.fliplr(x), y),
    "rotate": lambda x, y: any(np.array_equal(np.rot90(x, k), y) for k in (1, 2, 3)),
    "scale": lambda x, y: any(np.array_equal(np.kron(x, np.ones((k, k), int)), y) for k in (2, 3)),
    "gravity": lambda x, y: any(np.array_equal(fallen(x, d), y) for d in ("down", "up", "left", "right")),
    "crop": lambda x, y: np.array_equal(cropped(x), y),
    "border": lambda x, y: (x.shape == y.shape and np.array_equal(x[1:-1, 1:-1], y[1:-1, 1:-1])
                            and len(set(ring(y).tolist())) == 1 and ring(y)[0] != 0),
    "fill": lambda x, y: (enclosed(x).any() and np.array_equal(x[~enclosed(x)], y[~enclosed(x)])
                          and len(set(y[enclosed(x)].tolist())) == 1 and y[enclosed(x)][0] != 0),
    "recolour": one_colour_map,
}


def test_the_checks_refuse_near_misses():
    """Each check written above tells its rule from a plausible wrong output."""
    x = np.array([[0, 3, 0], [2, 0, 0], [0, 0, 0]])
    assert CHECKS["gravity"](x, fallen(x, "down"))
    assert not CHECKS["gravity"](x, np.array([[0, 0, 0], [0, 0, 0], [3, 2, 0]]))  # same colours, wrong places
    assert CHECKS["crop"](x, np.array([[0, 3], [2, 0]])) and not CHECKS["crop"](x, np.array([[3], [0]]))
    box = np.array([[1, 1, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1]])
    assert CHECKS["fill"](box, np.array([[1, 1, 1, 1], [1, 5, 5, 1], [1, 1, 1, 1]]))
    assert not CHECKS["fill"](box, np.array([[1, 1, 1, 1], [1, 5, 0, 1], [1, 1, 1, 1]]))  # half filled
    assert not CHECKS["recolour"](np.array([[1, 1]]), np.array([[2, 3]]))  # one colour, two images
    assert not CHECKS["border"](x, np.array([[4, 4, 4], [4, 0, 4], [4, 4, 5]]))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_obeys_its_rule(family):
    rng = np.random.default_rng(0)
    for n in range(20):
        task = make_task(family, rng, f"t{n}", size=(3, 12))
        assert valid(task)
        for pair in task.train + task.test:
            assert CHECKS[family](pair.input, pair.output), (family, n)
            assert not np.array_equal(pair.input, pair.output)


def test_rule_is_shared_by_all_pairs_of_a_task():
    rng = np.random.default_rng(1)
    for _ in range(20):
        task = make_task("recolour", rng, "t")
        mapping = {}
        for pair in task.train + task.test:
            for a, b in zip(pair.input.ravel(), pair.output.ravel(), strict=True):
                assert mapping.setdefault(int(a), int(b)) == b, "one colour map per task"


def test_recolour_demos_show_every_test_colour():
    """A recolour task is solvable from its demos: each colour of the test input is in a demo."""
    rng = np.random.default_rng(2)
    for _ in range(50):
        task = make_task("recolour", rng, "t")
        shown = set(np.unique(np.concatenate([p.input.ravel() for p in task.train])))
        assert set(np.unique(task.test[0].input)) <= shown


def test_generator_is_seeded_and_sizes_respected():
    a, b = generate_tasks(30, seed=5, size=(4, 6)), generate_tasks(30, seed=5, size=(4, 6))
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.train[0].input, y.train[0].input)
    for task in a:
        for pair in task.train:
            assert 4 <= min(pair.input.shape) and max(pair.input.shape) <= 6
    assert not np.array_equal(a[0].train[0].input, generate_tasks(1, seed=6, size=(4, 6))[0].train[0].input)


def test_synthetic_is_a_data_source():
    splits = load_source("synthetic:12")
    assert len(splits.training) == 12 and len(splits.evaluation) == 3
    assert not {t.task_id for t in splits.training} & {t.task_id for t in splits.evaluation}
