"""The attempts' choice, with and without enumerated candidates, from two validations of one checkpoint.

    python fixed.py --eval_only --resume RUN --eval_tasks 0 --attempt_ranking learned --enumerate 0 --run_dir A
    python fixed.py --eval_only --resume RUN --eval_tasks 0 --attempt_ranking learned --enumerate 8 --run_dir B
    python -m bench.choice A B [--first 100]

Prints, for each validation, pass@2 under every ranking it reported (votes, logprob, hedged and, with
a chooser, learned) beside the oracle and seconds a task (summary.json), and the near misses: the test
pairs whose better attempt in A is 1-2 or 3-5 cells off, and how many of them B holds among its
candidates (report.json's oracle). B must have scored the same tasks as A. With --first N, also
pass@2 of each run's own ranking, the oracle and seconds a task on the first N tasks (their reports).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.config import RANKINGS
from evaluation.compare import read_report

NEAR = ((1, 2), (3, 5))  # cells off, inclusive ranges


def summary(run: Path) -> dict:
    path = run / "summary.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no summary (the validation did not finish)")
    return json.loads(path.read_text())


def pairs(run: Path) -> dict[tuple[str, int], dict]:
    """(task id, test index) -> that pair's record in the run's report (attempts' cells wrong, oracle)."""
    return {(card["id"], j): pair for card in read_report(run)["cards"]
            for j, pair in enumerate(card["runs"][0]["pairs"])}


def cells_off(pair: dict) -> int:
    """A report pair's better attempt: its cells wrong (0 when neither attempt has the target's shape)."""
    return min((c for c in pair["cells_wrong"] if c is not None), default=0)


def near_misses(before: dict[tuple[str, int], dict], after: dict[tuple[str, int], dict]) -> list[tuple[str, int, int]]:
    """-> per NEAR range: (label, pairs of `before` whose better attempt is that many cells off, of
    them those whose target is among `after`'s candidates)."""
    missing = before.keys() - after.keys()
    if missing:
        raise SystemExit(f"the second run did not score {len(missing)} of the first's test pairs (e.g. {min(missing)})")
    out = []
    for low, high in NEAR:
        near = [k for k, p in before.items() if not p["oracle"] and low <= cells_off(p) <= high]
        out.append((f"{low}-{high} cells", len(near), sum(after[k]["oracle"] for k in near)))
    return out


def first_figures(run: Path, n: int) -> dict[str, float]:
    """The run's report on its first `n` tasks by id (ARC's evaluation order): test pairs, pass@2 of
    its configured ranking, oracle, seconds a task."""
    cards = sorted(read_report(run)["cards"], key=lambda c: c["id"])[:n]
    records = [p for c in cards for p in c["runs"][0]["pairs"]]
    return {"tasks": len(cards), "pairs": len(records),
            "pass2": sum(any(p["right"]) for p in records) / len(records),
            "oracle": sum(p["oracle"] for p in records) / len(records),
            "seconds": sum(c["runs"][0]["seconds"] for c in cards) / len(cards)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("without", type=Path, help="--eval_only run folder without --enumerate")
    ap.add_argument("with_", metavar="with", type=Path, help="--eval_only run folder of the same checkpoint with it")
    ap.add_argument("--first", type=int, default=0, help="also the figures of the first N tasks (from the reports)")
    args = ap.parse_args()
    print("| candidates | tasks | " + " | ".join(f"pass@2 {r}" for r in RANKINGS) + " | oracle | s/task |")
    print("|---" * (len(RANKINGS) + 4) + "|")
    for name, run in (("views' argmax", args.without), ("+ enumerated", args.with_)):
        s = summary(run)
        cells = [f"{100 * s[f'eval/pass2_{r}']:.1f}%" if f"eval/pass2_{r}" in s else "-" for r in RANKINGS]
        print(f"| {name} | {s['eval/tasks']:.0f} | {' | '.join(cells)} | {100 * s['eval/oracle']:.1f}% | "
              f"{s['eval/seconds_per_task']:.2f} |")
    print("\n| better attempt without enumeration | test pairs | target among the enumerated candidates |")
    print("|---|---|---|")
    for label, count, found in near_misses(pairs(args.without), pairs(args.with_)):
        print(f"| {label} off | {count} | {found} |")
    if args.first:
        print(f"\n| candidates, first {args.first} tasks | test pairs | pass@2 (the run's ranking) | oracle | s/task |")
        print("|---|---|---|---|---|")
        for name, run in (("views' argmax", args.without), ("+ enumerated", args.with_)):
            f = first_figures(run, args.first)
            print(f"| {name} | {f['pairs']} | {100 * f['pass2']:.1f}% | {100 * f['oracle']:.1f}% | "
                  f"{f['seconds']:.2f} |")


if __name__ == "__main__":
    main()
