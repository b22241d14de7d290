"""ARC scoring of predicted grids against targets, and the copy-the-input baseline."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from data.arc import Grid


def pair_metrics(pred: Grid, target: Grid) -> dict[str, float]:
    """shape: 1 if the predicted shape is right; cell_acc: share of equal cells, 0 if the shape is
    wrong; exact: 1 if the whole grid is right."""
    if pred.shape != target.shape:
        return {"shape_acc": 0.0, "cell_acc": 0.0, "exact": 0.0}
    equal = pred == target
    return {"shape_acc": 1.0, "cell_acc": float(equal.mean()), "exact": float(equal.all())}


def summarise(records: list[tuple[str, dict[str, float]]]) -> dict[str, float]:
    """Mean of every metric over test pairs, plus `task_score`: the share of a task's test pairs
    solved exactly, averaged over tasks (the official ARC score for one attempt)."""
    if not records:
        return {}
    out = {k: float(np.mean([m[k] for _, m in records])) for k in records[0][1]}
    by_task: dict[str, list[float]] = defaultdict(list)
    for task_id, m in records:
        by_task[task_id].append(m["exact"])
    out["task_score"] = float(np.mean([np.mean(v) for v in by_task.values()]))
    return out
