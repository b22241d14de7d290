"""RE-ARC (Hodel, "Addressing ARC via Procedural Example Generation", 2024) as a training source:
generated input/output examples of each ARC-AGI-1 training task (README "Data"; docs/runs.md, "Loading data").

An ARC task is a few demos and a query; a RE-ARC task is a pool of examples, so training draws
tasks from it: `--re_arc_sets K` demo sets a task, each `--re_arc_demos` demos and one query drawn
without replacement from the task's examples (seeded by --seed), so the episodes of a task hold K
different demo sets, not one. Each is an ArcTask `<id>~<k>` derived from `<id>` (its `family`), and
the overlap check against the evaluation tasks reads the family: no RE-ARC task may be an
evaluation task.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.arc import MAX_SIDE, ArcPair, ArcTask, DataError, parse_task

DERIVED = "~"  # <family id>~<demo set>


@dataclass(frozen=True)
class ReArcPool:
    """One RE-ARC task: its examples (validated) and how many were left out for a grid over 30x30."""

    task_id: str
    examples: tuple[ArcPair, ...]
    oversized: int


def _task_files(path: Path) -> dict[str, bytes]:
    """{task id: its file's bytes} from re_arc.zip or a folder (tasks/<id>.json, or re_arc/tasks/)."""
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(".json") and Path(n).parent.name == "tasks"]
            return {Path(n).stem: archive.read(n) for n in sorted(names)}
    for folder in (path / "tasks", path / "re_arc" / "tasks"):
        if folder.is_dir():
            return {f.stem: f.read_bytes() for f in sorted(folder.glob("*.json"))}
    raise DataError(f"re-arc:{path}: neither RE-ARC's re_arc.zip nor a folder holding tasks/<id>.json")


def _oversized(example: object) -> bool:
    """An example whose input or output grid has more than 30 rows or columns (else validated in full)."""
    if not isinstance(example, dict):
        return False
    grids = [example.get(k) for k in ("input", "output")]
    return any(isinstance(g, list) and (len(g) > MAX_SIDE or any(isinstance(r, list) and len(r) > MAX_SIDE
                                                                  for r in g)) for g in grids)


def parse_pool(raw: bytes, task_id: str, origin: str) -> ReArcPool:
    """One task file: a JSON list of {"input", "output"}. A malformed file or example is a DataError
    naming it; an example with a grid over 30x30 is counted and left out."""
    try:
        examples = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{origin}: not valid JSON ({err})") from None
    if not isinstance(examples, list) or not examples:
        raise DataError(f"{origin}: a RE-ARC task is a non-empty JSON list of {{\"input\", \"output\"}} examples")
    kept = [e for e in examples if not _oversized(e)]
    if not kept:
        return ReArcPool(task_id, (), len(examples))
    # one ARC task of every example, validated as any ARC file is
    pairs = parse_task({"train": kept, "test": kept[:1]}, task_id, origin).train
    return ReArcPool(task_id, pairs, len(examples) - len(kept))


def load_pools(path: str) -> tuple[ReArcPool, ...]:
    """Every task of RE-ARC's zip or folder at `path`, validated."""
    files = _task_files(Path(path))
    if not files:
        raise DataError(f"re-arc:{path}: no task files (tasks/<id>.json)")
    return tuple(parse_pool(raw, tid, f"re-arc:{path}: tasks/{tid}.json") for tid, raw in files.items())


def demo_sets(pool: ReArcPool, *, sets: int, demos: int, seed: int) -> tuple[ArcTask, ...]:
    """`sets` tasks drawn from one pool: each `demos` demos and one query, distinct examples, drawn by a
    generator seeded with (seed, the task id), so a task's sets do not depend on the other tasks.
    A pool with fewer than `demos` + 1 examples gives none."""
    if len(pool.examples) < demos + 1:
        return ()
    rng = np.random.default_rng([seed, *pool.task_id.encode()])
    out = []
    for k in range(sets):
        chosen = rng.choice(len(pool.examples), size=demos + 1, replace=False)
        picked = [pool.examples[int(i)] for i in chosen]
        out.append(ArcTask(f"{pool.task_id}{DERIVED}{k}", tuple(picked[:demos]), (picked[demos],), family=pool.task_id))
    return tuple(out)


def load_re_arc(path: str, *, sets: int, demos: int, seed: int) -> tuple[tuple[ArcTask, ...], str]:
    """RE-ARC at `path` -> (the training tasks drawn from it, the start-up line that counts them and
    what was left out)."""
    pools = load_pools(path)
    tasks = tuple(t for pool in pools for t in demo_sets(pool, sets=sets, demos=demos, seed=seed))
    if not tasks:
        raise DataError(f"re-arc:{path}: no task has the {demos + 1} examples a demo set needs")
    oversized = sum(p.oversized for p in pools)
    small = sum(len(p.examples) < demos + 1 for p in pools)
    line = (f"re-arc:{path}: {len(pools)} tasks, {sum(len(p.examples) for p in pools)} examples -> {len(tasks)} "
            f"training tasks ({sets} demo sets of {demos} demos + 1 query a task); left out: {oversized} examples "
            f"with a grid over {MAX_SIDE}x{MAX_SIDE}, {small} tasks with too few examples")
    return tasks, line
