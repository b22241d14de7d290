"""The geometric views the agents see equal the numpy transforms they name, canvas-encoded, and
the enclosed-background bit marks exactly the cells a fill rule fills."""

import numpy as np
import pytest
import torch

import training
from agents.adapter import AdapterSlice
from agents.conv_agent import FiLMConvAgent
from agents.views import NUM_VIEWS, SCALES, PromptedViews, view_canvases, views_fitting
from data.arc import ArcPair
from data.augment import Augmentation, dihedral
from data.canvas import encode, grid_extent
from data.demo_episodes import DemoEpisodes
from data.enclosed import enclosed_map
from data.features import crop_to_content
from data.synthetic import _fill_enclosed, _outlines, gravity


def expected_views(grid: np.ndarray) -> list[np.ndarray]:
    return ([dihedral(grid, k) for k in range(8)]
            + [np.kron(grid, np.ones((s, s), dtype=grid.dtype)) for s in SCALES]
            + [grid[::s, ::s] for s in SCALES] + [crop_to_content(grid)]
            + [gravity(grid, k) for k in (0, 2, 3, 1)])  # down, up, right, left


@pytest.mark.parametrize("side", [30, 21])
def test_views_match_the_numpy_transforms(side):
    rng = np.random.default_rng(0)
    grids = [rng.integers(0, 10, size=(int(rng.integers(1, 7)), int(rng.integers(1, 7)))) for _ in range(40)]
    grids += [rng.integers(0, 10, size=(20, 9)), np.zeros((1, 1), dtype=np.int64), np.zeros((3, 4), dtype=np.int64)]
    patch = np.zeros((9, 7), dtype=np.int64)
    patch[2:5, 3:6] = rng.integers(1, 10, size=(3, 3))
    grids.append(patch)
    canvas = torch.from_numpy(np.stack([encode(g) for g in grids]))[:, :side, :side]
    views = view_canvases(canvas, *grid_extent(canvas)).numpy()
    assert views.shape == (len(grids), NUM_VIEWS, side, side)
    for b, grid in enumerate(grids):
        for v, want in enumerate(expected_views(grid)):
            if max(want.shape) < side:  # else the view is cut by the canvas, like any grid
                assert np.array_equal(views[b, v], encode(want)[:side, :side]), (grid.shape, v)


@pytest.mark.parametrize("side", [30, 21])
def test_enclosed_background_is_what_a_fill_rule_fills(side):
    """Hollow rectangles (the fill family's inputs, holes up to 17x17), random sparse grids and a
    winding corridor, closed and open to the edge; the canvas may be cut below 30 (a batch's side)."""
    rng = np.random.default_rng(0)
    grids = [_outlines(rng, int(rng.integers(3, 20)), int(rng.integers(3, 20))) for _ in range(60)]
    grids += [rng.integers(0, 3, size=(int(rng.integers(1, 20)), int(rng.integers(1, 20)))) for _ in range(60)]
    closed = np.ones((9, 9), dtype=np.int64)  # a corridor of background winding down the grid
    closed[1::2, 1:8] = 0
    closed[2, 7] = closed[4, 1] = closed[6, 7] = 0
    opened = closed.copy()
    opened[1, 0] = 0  # the same corridor reaching the edge: outside, found ~30 steps from it
    grids += [closed, opened, np.zeros((5, 5), dtype=np.int64)]
    canvas = torch.from_numpy(np.stack([encode(g) for g in grids]))[:, :side, :side]
    enclosed = enclosed_map(canvas).numpy()
    for b, grid in enumerate(grids):
        want = _fill_enclosed(grid, 1) != grid
        assert np.array_equal(enclosed[b, :grid.shape[0], :grid.shape[1]], want), b
        assert enclosed[b].sum() == want.sum(), b  # nothing marked outside the grid
    assert enclosed[len(grids) - 3].sum() == 31 and enclosed[len(grids) - 2].sum() == 0


def test_a_one_hot_gate_shows_that_view_alone():
    """The gate's mix is of one-hot classes, so a decided gate gives exactly one view's classes."""
    torch.manual_seed(0)
    module = PromptedViews(prompt_dim=NUM_VIEWS)
    with torch.no_grad():
        module.gate.weight.copy_(100 * torch.eye(NUM_VIEWS))
    grid = np.arange(6).reshape(2, 3)
    canvas = torch.from_numpy(encode(grid))[None, :8, :8]
    h, w = grid_extent(canvas)
    out = module(canvas, h, w, torch.eye(NUM_VIEWS)[[4]])  # view 4: the transpose
    want = torch.nn.functional.one_hot(torch.from_numpy(encode(grid.T))[None, :8, :8], 12).float()
    assert torch.allclose(out, want, atol=1e-5)


def test_the_gate_mixes_the_views_one_hot_classes():
    """The mix is sum_v gate_v * one_hot(class under view v), gradients to the gate included."""
    torch.manual_seed(0)
    module = PromptedViews(prompt_dim=4)
    with torch.no_grad():
        module.gate.weight.normal_()
    rng = np.random.default_rng(0)
    canvas = torch.from_numpy(np.stack([encode(rng.integers(0, 10, (5, 7))) for _ in range(3)]))[:, :15, :15]
    prompt = torch.randn(3, 4)
    out = module(canvas, *grid_extent(canvas), prompt)
    gate = module.gate(prompt).softmax(-1)
    views = torch.nn.functional.one_hot(view_canvases(canvas, *grid_extent(canvas)), 12).float()
    want = torch.einsum("bv,bvijk->bijk", gate, views)
    torch.testing.assert_close(out, want)
    grad, = torch.autograd.grad((out * torch.arange(12.0)).sum(), module.gate.weight)
    want_grad, = torch.autograd.grad((want * torch.arange(12.0)).sum(), module.gate.weight)
    torch.testing.assert_close(grad, want_grad)


def flip_batches(rng: np.random.Generator, n: int, side: int = 9):
    grids = [rng.integers(0, 10, size=(int(rng.integers(3, 8)), int(rng.integers(3, 8)))) for _ in range(n)]
    x = torch.from_numpy(np.stack([encode(g) for g in grids]))[:, :side, :side]
    y = torch.from_numpy(np.stack([encode(np.flipud(g)) for g in grids]))[:, :side, :side]
    return x, y


def flip_exact_after_training(views: bool, steps: int = 120) -> float:
    """Train a small conv agent on up-down flips of random 3-7 grids; exact match on new grids."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    agent = FiLMConvAgent(prompt_dim=4, channels=16, dilations=(1, 2, 4, 1), views=views)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3)
    prompt = torch.ones(16, 4)
    for _ in range(steps):
        x, y = flip_batches(rng, 16)
        loss = torch.nn.functional.cross_entropy(agent(x, prompt).flatten(0, 2), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    x, y = flip_batches(rng, 64)
    with torch.no_grad():
        pred = agent(x, torch.ones(64, 4)).argmax(-1)
    return float((pred == y).flatten(1).all(1).float().mean())


@pytest.mark.slow
def test_views_make_a_flip_learnable_where_convolutions_alone_do_not():
    """The reason the views exist: with them a small conv agent learns flips in a hundred steps;
    without them the same budget gets (almost) no grid exactly right."""
    with_views, without = flip_exact_after_training(True), flip_exact_after_training(False)
    assert with_views >= 0.9 and without <= 0.1, (with_views, without)


@pytest.mark.parametrize("aug_id", [1, 2, 3, 4, 5, 6, 7, 1_000_003, 1_000_004, 1_000_005])
def test_an_adapter_kept_in_the_task_frame_shows_each_view_in_every_augmented_frame(aug_id):
    """A gate bias forcing view v, read through in_frames in an augmented sample's frame, shows that
    sample the augmented view v of the original grid: a view start means the same rule in every frame.
    Sides 7 and 13 (6 and 12 divisible by 2 and 3) make the scale-downs commute exactly."""
    rng = np.random.default_rng(aug_id)
    patch = np.zeros((7, 13), dtype=np.int64)
    patch[1:5, 2:9] = rng.integers(0, 10, size=(4, 7))
    grids = [rng.integers(0, 10, size=(7, 13)), patch, rng.integers(0, 3, size=(13, 7))]
    aug = Augmentation.from_id(aug_id, n_demos=3)
    module = PromptedViews(prompt_dim=4)
    for grid in grids:
        canvas = torch.from_numpy(encode(aug.grid(grid)))[None]
        for v, want in enumerate(expected_views(grid)):
            gate_bias = torch.zeros(1, NUM_VIEWS).index_fill(1, torch.tensor([v]), 100.0)
            seen = AdapterSlice(torch.zeros(1, 4), gate_bias).in_frames(torch.tensor([aug.dihedral]))
            out = module(canvas, *grid_extent(canvas), torch.zeros(1, 4), seen.gate_bias)
            if max(want.shape) < 30:
                assert torch.equal(out.argmax(-1)[0], torch.from_numpy(encode(aug.grid(want)))), (grid.shape, v)


def test_only_the_views_that_size_every_demo_right_fit():
    rng = np.random.default_rng(0)
    grids = [rng.integers(1, 10, size=(2, 3)), rng.integers(1, 10, size=(3, 2))]  # no background: crop keeps all
    doubled = views_fitting(tuple(ArcPair(g, np.tile(g, (2, 2))) for g in grids))
    assert [v for v, fit in enumerate(doubled) if fit] == [8]  # 2x each side: the 2x up-scaling
    same = views_fitting(tuple(ArcPair(g, g[::-1]) for g in grids))
    # the shape kept: identity, half turn and the two flips (2x3 stays 2x3), crop, gravity
    assert [v for v, fit in enumerate(same) if fit] == [0, 2, 5, 7, 12, 13, 14, 15, 16]
    halved = views_fitting((ArcPair(rng.integers(1, 10, size=(4, 5)), np.zeros((2, 3), dtype=np.int64)),))
    assert [v for v, fit in enumerate(halved) if fit] == [10]  # every 2nd cell: ceil(4 / 2) x ceil(5 / 2)


def test_the_model_reads_the_enclosed_background_its_batch_carries(small_cfg, state_and_batches):
    """collate marks each canvas's enclosed background on the host (data/enclosed.py: on a GPU the
    flood fill's loop waits for the device); the model's prediction from the batch's map is the one
    the agent makes computing it itself: both refinements of a training call."""
    cfg = small_cfg(data="synthetic:16", synthetic_rules="fill", batch_size=8)
    state, (batch,) = state_and_batches(cfg, 1)
    model = state.model.eval()
    assert batch["input_enclosed"].dtype == torch.bool and batch["input_enclosed"].any()
    batch = model.encode_prompts(batch, state.prompts, 0, training=False)
    alone = {k: v for k, v in batch.items() if k != "input_enclosed"}
    noise = model.rl_noise_state()
    carried = model(batch, "sampled+mean")
    model.set_rl_noise_state(noise)
    computed = model(alone, "sampled+mean")
    assert torch.equal(carried.logits, computed.logits)


def test_the_maps_a_task_s_demo_samples_carry_are_those_of_the_cut_batch(small_cfg):
    """Adaptation draws a task's few demo samples every step, so each sample's enclosed maps are
    computed once (data.demo_episodes) and cut with the batch: the same maps as of the cut canvases."""
    cfg = small_cfg(data="synthetic:16", synthetic_rules="fill")
    eval_set = training.build_data(cfg, torch.device("cpu")).eval_set
    tasks = list({ep.task.task_id: ep.task for ep in eval_set.episodes}.values())[:3]
    demos = DemoEpisodes(tasks, eval_set, seed=0, views=8)
    batch, _ = demos.draw({0: 0, 1: 1, 2: 2}, 8)
    assert all("input_enclosed" in s for s in demos.samples.values())
    assert batch["input_enclosed"].any() and batch["input"].shape[-1] < demos.sample(0, 0)["input"].shape[-1]
    assert torch.equal(batch["input_enclosed"], enclosed_map(batch["input"]))
