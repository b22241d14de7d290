"""bench/choice.py: the near misses of one validation and what a second one holds of them."""

import json

import numpy as np
import pytest
import torch

import training
from bench.choice import first_figures, near_misses, pairs
from bench.near_miss_depth import main, near_miss_depth, near_miss_pairs, reachable, target_depth
from data.augment import Augmentation
from data.canvas import NUM_CLASSES, NUM_COLOURS
from evaluation.enumeration import ALTERNATIVES
from evaluation.scoring import Candidates

SIDE = 8
CPU = torch.device("cpu")


def write_report(run, pair_records):
    run.mkdir()
    cards = [{"id": task, "runs": [{"pairs": records}]} for task, records in pair_records.items()]
    (run / "report.json").write_text(json.dumps({"header": {}, "cards": cards}))
    return run


def record(cells_wrong, oracle=False):
    return {"attempts": [], "right": [c == 0 for c in cells_wrong], "cells_wrong": cells_wrong, "oracle": oracle}


def test_near_misses_count_the_better_attempt_and_what_the_second_run_found(tmp_path):
    before = write_report(tmp_path / "a", {
        "t1": [record([2, 7]), record([None, 4])],  # 2 cells off; 4 cells off (the first attempt's shape is wrong)
        "t2": [record([1, 1]), record([9, None])],  # 1 cell off; 9 cells off: no near miss
        "t3": [record([0, 3], oracle=True), record([None, None])],  # solved; wrong shapes
    })
    after = write_report(tmp_path / "b", {
        "t1": [record([2, 7], oracle=True), record([None, 4])],
        "t2": [record([1, 1], oracle=True), record([9, None], oracle=True)],
        "t3": [record([0, 3], oracle=True), record([None, None])],
    })
    assert near_misses(pairs(before), pairs(after)) == [("1-2 cells", 2, 2), ("3-5 cells", 1, 0)]


def test_the_second_run_must_score_the_same_pairs(tmp_path):
    before = write_report(tmp_path / "a", {"t1": [record([2, 7])], "t2": [record([1, 1])]})
    after = write_report(tmp_path / "b", {"t1": [record([2, 7])]})
    with pytest.raises(SystemExit, match="did not score 1 of the first's test pairs"):
        near_misses(pairs(before), pairs(after))


def test_near_miss_pairs_are_the_report_pairs_one_to_five_cells_off(tmp_path):
    run = write_report(tmp_path / "a", {
        "t1": [record([2, 7]), record([None, 4])],
        "t2": [record([1, 1], oracle=True), record([9, None])],  # found (oracle), too far
        "t3": [record([6, 5])],
    })
    assert near_miss_pairs(run) == {"t1": [0, 1], "t3": [0]}


def one_view(table):
    """An identity view whose [S, S, 12] log-softmax holds `table` [H, W, 10] at its top left."""
    logp = np.zeros((SIDE, SIDE, NUM_CLASSES), np.float32)
    logp[: table.shape[0], : table.shape[1], :NUM_COLOURS] = table
    return Augmentation(), logp


def test_target_depth_reads_the_deficit_the_rank_and_unreachable_cells():
    rng = np.random.default_rng(0)
    table = np.log(rng.dirichlet(np.ones(NUM_COLOURS), size=(3, 4))).astype(np.float32)
    views = [one_view(table), one_view(table)]
    summed = 2 * table.astype(np.float64)
    best = summed.argmax(-1)
    # the cheapest single change of the walk: the best grid's first alternative
    order = np.argsort(-summed, axis=-1, kind="stable")
    costs = summed.max(-1) - np.take_along_axis(summed, order[..., 1:2], -1)[..., 0]
    i, j = np.unravel_index(costs.argmin(), costs.shape)
    near = best.copy()
    near[i, j] = order[i, j, 1]
    depth = target_depth(views, near, k_max=8)
    assert depth["rank"] == 1 and depth["wrong"] == 1 and depth["beyond"] == 0
    assert depth["deficit"] == pytest.approx(costs[i, j] / 2, rel=1e-5)  # nats a view
    assert target_depth(views, best, k_max=8)["rank"] == 0
    far = best.copy()
    far[0, 0] = order[0, 0, 1 + ALTERNATIVES]  # beyond the alternatives: no k reaches it
    depth = target_depth(views, far, k_max=8)
    assert depth["beyond"] == 1 and depth["rank"] is None


def test_reachable_counts_floor_k_and_the_voted_shape():
    depths = [{"shape_voted": True, "rank": 3, "deficit": 0.5}, {"shape_voted": True, "rank": 100, "deficit": 3.0},
              {"shape_voted": False, "rank": 1, "deficit": 0.1}, {"shape_voted": True, "rank": None, "deficit": 0.2}]
    assert reachable(depths, 1.0, 8) == 1
    assert reachable(depths, 4.0, 512) == 2
    assert reachable(depths, 4.0, 64) == 1


def test_near_miss_depth_only_for_near_misses_and_reads_the_voted_shapes():
    rng = np.random.default_rng(1)
    table = np.log(rng.dirichlet(np.ones(NUM_COLOURS), size=(3, 4))).astype(np.float32)
    aug, logp = one_view(table)
    best = table.argmax(-1)
    cands = Candidates()
    cands.add(best, 0.0, aug, logp)
    cands.add(np.zeros((2, 2), np.int64), 0.0)  # another shape, one vote
    target = best.copy()
    target[0, :2] = (best[0, :2] + 1) % NUM_COLOURS  # two cells off the votes' first attempt
    attempts = (best, best)
    depth = near_miss_depth(cands, attempts, target, k_max=64)
    assert depth["off"] == 2 and depth["shape_voted"] and depth["wrong"] == 2
    assert near_miss_depth(cands, attempts, best, k_max=64) is None  # among the candidates: found, not missed
    far = (best + 1) % NUM_COLOURS
    assert near_miss_depth(cands, attempts, far, k_max=64) is None  # 12 cells off: not near


@pytest.mark.slow
def test_the_bench_validates_the_reported_tasks_again_and_prints_its_tables(small_cfg, tmp_path, capsys):
    """The bench end to end on a small run: a report naming every evaluation pair a near miss (a run
    this small makes none of its own), its tasks validated again, the tables printed."""
    flags = dict(batch_size=4, eval_batch_size=8, agent_channels=16, prompt_dim=32, ttt_steps=4)
    cfg = small_cfg(max_batches=1, **flags)
    training.train(cfg, CPU)
    data = training.build_data(cfg, CPU)
    episodes = data.eval_set.episodes
    by_task = {ep.task.task_id: len(ep.task.test) for ep in episodes}
    write_report(tmp_path / "report", {t: [record([1, 3])] * n for t, n in by_task.items()})
    argv = [str(tmp_path / "report"), "--k_max", "16", "--", "--data", cfg.data.data, "--eval_only",
            "--resume", cfg.run.run_dir, "--run_dir", str(tmp_path / "again"),
            *[x for k, v in flags.items() for x in (f"--{k}", str(v))]]
    main(argv)
    out = capsys.readouterr().out
    assert f"{len(episodes)} near misses in {tmp_path / 'report'}" in out
    assert "| --enumerate_floor | k=8 | k=64 | k=512 |" in out and "| 8 | " in out


def test_first_figures_read_the_first_tasks_by_id(tmp_path):
    run = write_report(tmp_path / "a", {
        "b": [record([0, 3], oracle=True), record([2, 2])],
        "a": [record([4, 1], oracle=True)],
        "c": [record([0, 0], oracle=True)],  # not among the first two
    })
    cards = json.loads((run / "report.json").read_text())
    for card, seconds in zip(cards["cards"], (2.0, 4.0, 9.0), strict=True):
        card["runs"][0]["seconds"] = seconds
    (run / "report.json").write_text(json.dumps(cards))
    assert first_figures(run, 2) == {"tasks": 2, "pairs": 3, "pass2": 1 / 3, "oracle": 2 / 3, "seconds": 3.0}
