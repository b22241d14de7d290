"""Intervals and paired tests for scores over ARC tasks (docs/runs.md, "Intervals"; evaluation/compare.py).

A task's test pairs are not independent (one rule, one adaptation), so every interval resamples whole
tasks, with a fixed seed so that a report is the same every time it is written. McNemar's test and the sign
test are both the two-sided exact binomial test (under no difference, each pair or task is either run's
with probability 1/2).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
METHOD = f"95% percentile bootstrap over tasks ({RESAMPLES} resamples)"
SEED = 0


def _by_task(values: Sequence[tuple[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(task id, value) per test pair -> per task the sum of its values and its pair count, [T] float64."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for task, value in values:
        sums[task] += value
        counts[task] += 1
    return np.array(list(sums.values())), np.array([counts[t] for t in sums], dtype=np.float64)


def _draws(n_tasks: int) -> np.ndarray:
    """[RESAMPLES, n_tasks] int64: the tasks each draw takes (with replacement), the same for every call
    with the same number of tasks."""
    return np.random.default_rng(SEED).integers(0, n_tasks, size=(RESAMPLES, n_tasks))


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - LEVEL) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def interval(values: Sequence[tuple[str, float]], per: str = "pair") -> tuple[float, float]:
    """The 95% interval of a mean over tasks' test pairs: `values` (task id, value) a test pair.
    per="pair": the metric is the mean over test pairs (pass@2, the held-out loss); per="task": the
    mean over tasks of each task's mean (the task score). (nan, nan) without values."""
    if not values:
        return math.nan, math.nan
    sums, counts = _by_task(values)
    idx = _draws(len(sums))
    if per == "pair":
        samples = sums[idx].sum(1) / counts[idx].sum(1)
    elif per == "task":
        samples = (sums / counts)[idx].mean(1)
    else:
        raise ValueError(f"per={per!r}: 'pair' or 'task'")
    return _percentiles(samples)


def paired(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> dict[str, float]:
    """B - A on the test pairs both scored: `a`, `b` map (task id, pair) to a value. -> {"pairs", "tasks",
    "a", "b", "diff", "lo", "hi"}: the means over the shared pairs, their difference and its 95% interval
    (shared tasks resampled). Raises ValueError when nothing is shared."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two runs share no test pair")
    diffs = [(task, b[(task, pair)] - a[(task, pair)]) for task, pair in shared]
    lo, hi = interval(diffs)
    return {"pairs": len(shared), "tasks": len({t for t, _ in shared}),
            "a": float(np.mean([a[k] for k in shared])), "b": float(np.mean([b[k] for k in shared])),
            "diff": float(np.mean([d for _, d in diffs])), "lo": lo, "hi": hi}


def binomial_two_sided(k: int, n: int) -> float:
    """The exact two-sided p-value of k successes in n trials of probability 1/2 (1.0 when n is 0):
    the probability of an outcome at most as likely as k."""
    if n == 0:
        return 1.0
    probs = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    return float(min(1.0, sum(p for p in probs if p <= probs[k] * (1 + 1e-9))))


def mcnemar(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> dict[str, float]:
    """McNemar's exact test of a right/wrong metric (0/1 a pair) on the shared pairs: {"gained" (B right,
    A wrong), "lost" (the reverse), "p"}."""
    shared = set(a) & set(b)
    gained = sum(1 for k in shared if b[k] and not a[k])
    lost = sum(1 for k in shared if a[k] and not b[k])
    return {"gained": gained, "lost": lost, "p": binomial_two_sided(gained, gained + lost)}


def sign_test(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> dict[str, float]:
    """The exact sign test over tasks of a loss on the shared pairs: each task's mean of B - A over its
    pairs, ties dropped. {"lower" (tasks where B's loss is lower), "higher", "p"}."""
    diffs: dict[str, list[float]] = defaultdict(list)
    for task, pair in set(a) & set(b):
        diffs[task].append(b[(task, pair)] - a[(task, pair)])
    means = [float(np.mean(v)) for v in diffs.values()]
    lower, higher = sum(d < 0 for d in means), sum(d > 0 for d in means)
    return {"lower": lower, "higher": higher, "p": binomial_two_sided(lower, lower + higher)}


def beyond_noise(lo: float, hi: float) -> bool:
    """Whether a difference's interval excludes zero."""
    return lo > 0 or hi < 0
