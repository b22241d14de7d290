"""How the two attempts are chosen: one scoring with `--views` voted views a test input, then each
ranking of `RANKINGS` over the first N of those views (N = 8, 16, ... up to `--views`), paired with
the votes' (the suite's: `evaluation.scoring.Candidates.ranked`) on the same test pairs.

    python -m bench.rankings [--size small] [--tasks 78] [--views 32] [--set NAME=VALUE ...]

The views of a test input are `data.augment.view_ids`: the first 8 of 32 are the 8 the default votes
over, so one scoring gives every N. Each row: pass@2 with its 95% interval over tasks, and its
difference from the votes' at the same N (points, interval, pairs gained and lost). The oracle (the
output among any view's prediction) bounds what a ranking can reach. The weights are the ones as
built (nothing trained), adapted as the default validation adapts them (`--set` changes any flag).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable

import numpy as np

import training
from bench.learnability import EVAL_DEFAULTS, device_of, parse_settings
from engine.config import EVAL_SIZES, Config
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.intervals import interval, mcnemar, paired
from evaluation.scoring import Candidates


def pair_record(cands: Candidates, target) -> dict:
    """One test input's views as the rankings read them: each view's candidate (an index into the
    distinct grids) and mean colour log-probability, every candidate's log-probability under every
    view ([C, V], -inf where it does not fit) and the canvas cells it reads, and which is the output."""
    keys = list(cands.grids)
    logprob, cells = cands.logprobs([cands.grids[k] for k in keys])
    seen: dict[bytes, int] = defaultdict(int)
    mean = []
    for k in cands.view_keys:  # a candidate's views' mean log-probabilities are kept in view order
        mean.append(cands.logprob[k][seen[k]])
        seen[k] += 1
    return {"view": np.array([keys.index(k) for k in cands.view_keys]), "mean": np.array(mean),
            "logprob": logprob, "cells": np.maximum(cells, 1), "correct": [k == cands.key(target) for k in keys]}


def _votes(r: dict, n: int) -> list[int]:
    """Most votes, ties by the higher mean log-probability (Candidates.ranked over the first n views)."""
    view, mean = r["view"][:n], r["mean"][:n]
    return sorted(set(view.tolist()), key=lambda c: (-(view == c).sum(), -mean[view == c].mean()))


def _summed(r: dict, n: int) -> list[int]:
    """The highest log-probability summed over the first n views (the ARChitects' augmentation score)."""
    return sorted(set(r["view"][:n].tolist()), key=lambda c: -r["logprob"][c, :n].sum())


def _per_cell(r: dict, n: int) -> list[int]:
    """The highest log-probability a cell read, averaged over the first n views."""
    return sorted(set(r["view"][:n].tolist()), key=lambda c: -(r["logprob"][c, :n] / r["cells"][c, :n]).mean())


def _hedged(r: dict, n: int) -> list[int]:
    """The votes' first, then the summed log-probability's first where it differs (else the votes' second)."""
    votes, summed = _votes(r, n), _summed(r, n)
    return [votes[0], summed[0] if summed[0] != votes[0] else votes[min(1, len(votes) - 1)]]


def _votes_then_summed(r: dict, n: int) -> list[int]:
    """Most votes, ties by the summed log-probability."""
    view = r["view"][:n]
    return sorted(set(view.tolist()), key=lambda c: (-(view == c).sum(), -r["logprob"][c, :n].sum()))


RANKINGS: dict[str, Callable[[dict, int], list[int]]] = {
    "votes": _votes, "summed": _summed, "per-cell": _per_cell, "hedged": _hedged,
    "votes-then-summed": _votes_then_summed}


def pass2(records: list[tuple[str, dict]], rank: Callable[[dict, int], list[int]], n: int) -> dict:
    """(task id, pair index) -> 1.0 when the ranking's first two over n views hold the output."""
    return {(task, j): float(any(r["correct"][c] for c in rank(r, n)[:2])) for j, (task, r) in enumerate(records)}


def table(records: list[tuple[str, dict]], views: int) -> list[str]:
    lines = []
    for n in sorted({*(8 * 2 ** k for k in range(8) if 8 * 2 ** k < views), views}):
        oracle = np.mean([any(r["correct"][c] for c in set(r["view"][:n].tolist())) for _, r in records])
        lines += [f"\n{n} views, oracle {oracle:.1%}, {len(records)} test pairs", "",
                  "| ranking | pass@2 (95%) | - votes (95%) | gained, lost |", "|---|---|---|---|"]
        base = pass2(records, _votes, n)
        for name, rank in RANKINGS.items():
            mine = pass2(records, rank, n)
            lo, hi = interval([(task, v) for (task, _), v in mine.items()])
            d, m = paired(base, mine), mcnemar(base, mine)
            lines.append(f"| {name} | {np.mean(list(mine.values())):.1%} ({lo:.1%}-{hi:.1%}) | "
                         f"{100 * d['diff']:+.2f} ({100 * d['lo']:+.2f} to {100 * d['hi']:+.2f}) | "
                         f"{m['gained']}, {m['lost']} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=78, help="the first N evaluation tasks of --size")
    ap.add_argument("--size", choices=EVAL_SIZES, default="small", help="all, small or large (--eval_size)")
    ap.add_argument("--views", type=int, default=32, help="voted views a test input (at least 8)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a fixed.py flag")
    ap.add_argument("--cache", default="runs/rankings", help="the prompt cache's folder")
    args = ap.parse_args(argv)
    if args.views < 8 or args.tasks < 1:
        raise SystemExit(f"--views {args.views} --tasks {args.tasks}: at least 8 views and 1 task")
    cfg = Config.from_flags(run_dir=args.cache, eval_only=True, **{**EVAL_DEFAULTS, "heldout_loss": False,
                            "eval_augments": args.views, **parse_settings(args.set), "eval_tasks": args.tasks,
                            "eval_size": args.size})
    device = device_of(cfg)
    data, state = training.load_run(cfg, None, device, cache_dir=args.cache)
    kept: dict[int, tuple[str, dict]] = {}

    def keep(i: int, cands: Candidates) -> None:
        ep = data.eval_set.episodes[i]
        if ep.query.answered:
            kept[i] = (ep.task.task_id, pair_record(cands, ep.query.output))

    scores = score_tasks(state.model, state.prompts, data.eval_set, first_tasks(data.eval_set, args.tasks),
                         cfg=cfg, device=device, desc="rankings", on_candidates=keep)
    records = list(kept.values())
    if list(pass2(records, _votes, args.views).values()) != [scores.records[i][1]["pass2"] for i in kept]:
        raise SystemExit("bench.rankings: the votes over every view differ from the suite's attempts")
    print("\n".join(table(records, args.views)))


if __name__ == "__main__":
    main()
