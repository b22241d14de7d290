"""Intervals over tasks and the exact paired tests (evaluation/intervals.py), against values worked
by hand and against what resampling must do."""

import math

import numpy as np
import pytest

from evaluation.intervals import beyond_noise, binomial_two_sided, interval, mcnemar, paired, sign_test


def test_exact_binomial_p_values_by_hand():
    assert binomial_two_sided(0, 0) == 1.0
    assert math.isclose(binomial_two_sided(0, 5), 2 / 32)  # all 5 one way: 1/32 each tail
    assert math.isclose(binomial_two_sided(1, 5), 12 / 32)  # 0, 1, 4, 5 of 5: (1 + 5 + 5 + 1) / 32
    assert binomial_two_sided(2, 4) == 1.0
    assert math.isclose(binomial_two_sided(3, 5), 1.0)
    assert binomial_two_sided(2, 5) == binomial_two_sided(3, 5)


def test_an_interval_resamples_tasks_and_keeps_each_metric_s_definition():
    same = [(f"t{i}", 0.25) for i in range(40)]
    assert interval(same) == (0.25, 0.25)
    # one task of 9 solved pairs and 9 tasks of one unsolved pair: pair mean 0.5, task mean 0.1
    values = [("big", 1.0)] * 9 + [(f"t{i}", 0.0) for i in range(9)]
    lo, hi = interval(values, "pair")  # a draw of k copies of the big task: 9k / (9k + 10 - k)
    assert lo == 0.0 and any(math.isclose(hi, 9 * k / (8 * k + 10)) for k in range(2, 10))
    lo, hi = interval(values, "task")  # the same draws: k / 10
    assert lo == 0.0 and any(math.isclose(hi, k / 10) for k in range(2, 10)) and hi < 0.5
    with pytest.raises(ValueError):
        interval(values, "cell")
    assert all(math.isnan(x) for x in interval([]))


def test_six_of_104_has_the_interval_of_a_binomial_over_tasks():
    """About the issue's 6 of 104: one pair a task, so the bootstrap is the binomial's (about 2-11%)."""
    values = [(f"t{i}", float(i < 6)) for i in range(104)]
    lo, hi = interval(values)
    assert 0.01 <= lo <= 0.03 and 0.09 <= hi <= 0.11 and interval(values) == (lo, hi)  # the same every time


def test_paired_differences_and_mcnemar_count_the_same_pairs():
    a = {(f"t{i}", "test[0]"): float(i in (0, 1, 2, 3, 4)) for i in range(100)}
    b = {(f"t{i}", "test[0]"): float(i in (0, 1, 2, 5, 6, 7)) for i in range(100)}
    b[("only-b", "test[0]")] = 1.0  # not shared: left out
    d = paired(a, b)
    assert d["pairs"] == 100 and math.isclose(d["diff"], 0.01) and d["lo"] < 0 < d["hi"]
    assert not beyond_noise(d["lo"], d["hi"])
    m = mcnemar(a, b)
    assert (m["gained"], m["lost"]) == (3, 2) and m["p"] == 1.0
    far = {k: 1.0 for k in a}
    d = paired(a, far)
    assert beyond_noise(d["lo"], d["hi"]) and mcnemar(a, far)["p"] < 1e-20
    with pytest.raises(ValueError):
        paired(a, {("x", "test[0]"): 0.0})


def test_the_sign_test_counts_tasks_not_pairs():
    a = {("t1", "test[0]"): 1.0, ("t1", "test[1]"): 1.0, ("t2", "test[0]"): 1.0, ("t3", "test[0]"): 2.0}
    b = {("t1", "test[0]"): 0.5, ("t1", "test[1]"): 0.7, ("t2", "test[0]"): 0.9, ("t3", "test[0]"): 2.0}
    s = sign_test(a, b)
    assert (s["lower"], s["higher"]) == (2, 0) and s["p"] == 0.5  # t3 ties; 2 of 2 lower: p = 2/4
    assert np.isclose(paired(a, b)["diff"], (-0.5 - 0.3 - 0.1 + 0) / 4)
