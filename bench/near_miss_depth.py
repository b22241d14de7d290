"""How deep the near misses lie under the views' summed per-cell distribution: what --enumerate would need.

    python fixed.py --eval_only --resume RUN --eval_tasks 0 --enumerate 0 --run_dir A   # any validation of RUN
    python -m bench.near_miss_depth A -- --eval_only --resume RUN [RUN's flags and A's validation flags]

Reads A's report for the test pairs whose better attempt is 1-5 cells off and whose output is not among
the candidates (bench/choice.py's near misses), validates their tasks again from the checkpoint (the
flags after `--`, as fixed.py takes them), and for each near miss reads where its output lies in the
table --enumerate walks (evaluation/enumeration.py: the views' log-probabilities of its shape, summed):

- deficit: how far below the table's best grid the output is, in nats a view (--enumerate_floor's unit);
- beyond: wrong cells whose right colour is not among the cell's 1 + ALTERNATIVES best (no k reaches it);
- rank: the output's place in the best-first walk (0: the best grid), up to --k_max.

Then, for floors and k's, how many near misses `--enumerate k --enumerate_floor F` would propose. The
output's shape must also be among the SHAPES_ENUMERATED most voted (column `shape voted`). It reads
evaluation outputs, as every score does; it is a measurement, never a training signal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from bench.choice import NEAR, cells_off, pairs
from data.arc import Grid
from data.augment import Augmentation
from engine.checkpoint import find_checkpoint
from evaluation.enumeration import ALTERNATIVES, best_grids, summed_table
from evaluation.evaluate import ranked_attempts, score_tasks
from evaluation.scoring import SHAPES_ENUMERATED, Candidates
from training import load_run
from training.build import prompt_cache_dir
from training.cli import parse

CPU = torch.device("cpu")
FLOORS = (1.0, 2.0, 4.0, 8.0)  # nats a view
KS = (8, 64, 512)


def target_depth(views: list[tuple[Augmentation, np.ndarray]], target: Grid, k_max: int) -> dict | None:
    """Where `target` [H, W] int64 lies in the views' summed table of its shape. views: (augmentation,
    log-softmax [S, S, 12] float32) pairs. -> {"deficit": nats a view below the best grid, "wrong":
    cells where the best grid differs, "beyond": of them, cells whose target colour is not among the
    1 + ALTERNATIVES best, "rank": the target's index in best_grids's walk, None past k_max or
    unreachable}; None when no view's canvas holds the shape."""
    table, count = summed_table(views, target.shape)
    if not count:
        return None
    cells = table.reshape(-1, table.shape[-1])
    colours = target.reshape(-1)
    lost = cells.max(-1) - cells[np.arange(len(colours)), colours]  # [H*W] nats, >= 0
    order = np.argsort(-cells, axis=1, kind="stable")  # best_grids's order of a cell's colours
    place = (order == colours[:, None]).argmax(1)  # the target colour's place among its cell's colours
    beyond = int((place > ALTERNATIVES).sum())
    rank = None
    if not beyond:
        walk = best_grids(table, k_max, float(lost.sum()) + 1e-6)
        rank = next((i for i, g in enumerate(walk) if (g == target).all()), None)
    return {"deficit": float(lost.sum()) / count, "wrong": int((place > 0).sum()), "beyond": beyond, "rank": rank}


def near_miss_depth(cands: Candidates, attempts: tuple[Grid, Grid], target: Grid, k_max: int) -> dict | None:
    """`target_depth` of a near miss (the better of `attempts` 1-5 cells off `target`, which is not
    among `cands`), with "off" (those cells) and "shape_voted" (the target's shape among the
    SHAPES_ENUMERATED most voted, the shapes --enumerate walks); None for any other test input."""
    off = min((int((a != target).sum()) for a in attempts if a.shape == target.shape), default=0)
    if cands.contains(target) or not NEAR[0][0] <= off <= NEAR[-1][1]:
        return None
    depth = target_depth(cands.views, target, k_max)
    if depth is None:
        return None
    return {"off": off, "shape_voted": target.shape in cands.voted_shapes()[:SHAPES_ENUMERATED], **depth}


def near_miss_pairs(report_run: Path) -> dict[str, list[int]]:
    """task id -> test indices of `report_run`'s near misses (NEAR's cell ranges, output not a candidate)."""
    low, high = NEAR[0][0], NEAR[-1][1]
    out: dict[str, list[int]] = {}
    for (task, j), p in pairs(report_run).items():
        if not p["oracle"] and low <= cells_off(p) <= high:
            out.setdefault(task, []).append(j)
    return out


def reachable(depths: list[dict], floor: float, k: int) -> int:
    """Near misses `--enumerate k --enumerate_floor floor` proposes (the shape voted, every wrong cell
    within the alternatives, within the floor and among the first k)."""
    return sum(d["shape_voted"] and d["rank"] is not None and d["rank"] < k and d["deficit"] <= floor for d in depths)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a validation's run folder (report.json) to take the near misses from")
    ap.add_argument("--k_max", type=int, default=512, help="how deep the walk looks for each output")
    ap.epilog = "after --: fixed.py's flags for the checkpoint's validation (--eval_only --resume RUN ...)"
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    cfg = parse(argv[cut + 1:], "bench.near_miss_depth", __doc__)
    if not cfg.run.resume:
        raise SystemExit("bench.near_miss_depth: give the checkpoint after --: -- --eval_only --resume RUN ...")
    wanted = near_miss_pairs(args.report)
    checkpoint = find_checkpoint(cfg.run.resume)
    data, state = load_run(cfg, checkpoint, CPU, cache_dir=prompt_cache_dir(cfg, checkpoint.parent.parent))
    dataset = data.eval_set
    depths: list[dict] = []

    def read(i: int, cands: Candidates) -> None:
        ep = dataset.episodes[i]
        attempts = ranked_attempts(cands, cfg.eval.attempt_ranking, state.chooser, ep)
        depth = near_miss_depth(cands, attempts, ep.query.output, args.k_max)
        if depth is not None:  # a near miss of this validation (it may differ from the report's by a cell or a view)
            depths.append({"task": ep.task.task_id, **depth})

    score_tasks(state.model, state.prompts, dataset, sorted(wanted), cfg=cfg, device=CPU,
                desc="near misses", chooser=state.chooser, on_candidates=read)
    print(f"{sum(map(len, wanted.values()))} near misses in {args.report}; {len(depths)} again in this validation\n")
    print("| task | cells off | shape voted | deficit (nats a view) | wrong cells | beyond the alternatives | rank |")
    print("|---|---|---|---|---|---|---|")
    for d in sorted(depths, key=lambda d: d["deficit"]):
        rank = d["rank"] if d["rank"] is not None else (f">{args.k_max}" if not d["beyond"] else "-")
        print(f"| {d['task']} | {d['off']} | {'yes' if d['shape_voted'] else 'no'} | {d['deficit']:.2f} | "
              f"{d['wrong']} | {d['beyond']} | {rank} |")
    print("\n| --enumerate_floor | " + " | ".join(f"k={k}" for k in KS) + " |")
    print("|---" * (len(KS) + 1) + "|")
    for floor in FLOORS:
        print(f"| {floor:g} | " + " | ".join(f"{reachable(depths, floor, k)} of {len(depths)}" for k in KS) + " |")


if __name__ == "__main__":
    main()
