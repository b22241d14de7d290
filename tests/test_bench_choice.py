"""bench/choice.py: the near misses of one validation and what a second one holds of them."""

import json

import pytest

from bench.choice import near_misses, pairs


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
