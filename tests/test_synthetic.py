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


CHECKS = {
    "transpose": lambda x, y: np.array_equal(x.T, y),
    "flip": lambda x, y: np.array_equal(np.flipud(x), y) or np.array_equal(np.fliplr(x), y),
    "rotate": lambda x, y: any(np.array_equal(np.rot90(x, k), y) for k in (1, 2, 3)),
    "scale": lambda x, y: any(np.array_equal(np.kron(x, np.ones((k, k), int)), y) for k in (2, 3)),
    "gravity": lambda x, y: sorted(x[x > 0].tolist()) == sorted(y[y > 0].tolist()),
    "crop": lambda x, y: y.shape <= x.shape and y.any(0)[[0, -1]].all() and y.any(1)[[0, -1]].all(),
    "border": lambda x, y: np.array_equal(x[1:-1, 1:-1], y[1:-1, 1:-1]) and len(set(y[0].tolist())) == 1,
    "fill": lambda x, y: np.array_equal(x[x > 0], y[x > 0]) and (y[x == 0] != x[x == 0]).any(),
    "recolour": lambda x, y: x.shape == y.shape and ((x == 0) == (y == 0)).all(),
}


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
            for a, b in zip(pair.input.ravel(), pair.output.ravel()):
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
    for x, y in zip(a, b):
        assert np.array_equal(x.train[0].input, y.train[0].input)
    for task in a:
        for pair in task.train:
            assert 4 <= min(pair.input.shape) and max(pair.input.shape) <= 6
    assert not np.array_equal(a[0].train[0].input, generate_tasks(1, seed=6, size=(4, 6))[0].train[0].input)


def test_synthetic_is_a_data_source():
    splits = load_source("synthetic:12")
    assert len(splits.training) == 12 and len(splits.evaluation) == 3
    assert not {t.task_id for t in splits.training} & {t.task_id for t in splits.evaluation}
