"""Per-task adaptation: what each method buys, and what it costs per task, in one run and one table.

    python -m bench.adaptation [--sections unseen,arc] [--minutes 5] [--tasks 100] [--variants ...]

Sections:
  unseen  train on the synthetic families recolour, rotate, gravity, crop, border; evaluate on
          held-out tasks of flip, transpose, scale, fill, which training never showed
  arc     ARC-AGI-1: train for `--arc_minutes`, then evaluate the first `--arc_tasks` evaluation tasks
  arc-transductive   the same with --train_on_eval_demos --task_embedding (the evaluation tasks'
          demos join training; their test outputs never do)

Every row re-validates the run's final checkpoint with the settings of one variant (a name and
fixed.py flags) and prints exact, pass@2, the oracle, and seconds per task (adaptation and
prediction). Ratios between rows are measured in this one run.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.learnability import evaluate_variant, fmt, parse_settings, run
from engine.config import SECTION_OF, Config

TRAIN_FAMILIES = "recolour,rotate,gravity,crop,border"
UNSEEN_FAMILIES = "flip,transpose,scale,fill"


def weight_ttt(steps: int, stop_views: int, lr: float = 1e-3, params: str = "all") -> dict:
    """After the view-start search, `params` (all weights) trained at most `steps` steps, a task stopping
    once its demos are exact under `stop_views` views."""
    return {"ttt_steps": steps, "ttt_params": params, "ttt_lr": lr, "ttt_stop_views": stop_views}


def search(**flags) -> dict:
    """The view-start search alone (or nothing, without it), no test-time training."""
    return {"ttt_steps": 0, **flags}


# name (no commas: --variants lists them) -> flags; the defaults of fixed.py hold where a variant says nothing
VARIANTS = {
    "none": search(view_starts=False),
    "mean + view starts": search(),
    "all weights 30 steps (per task)": {"view_starts": False, "ttt_steps": 30, "ttt_params": "all", "ttt_lr": 1e-3,
                                        "ttt_check_every": 0},
    "view starts + all weights 30 steps": {"ttt_steps": 30, "ttt_params": "all", "ttt_lr": 1e-3,
                                           "ttt_check_every": 0},
    **{f"view starts + all weights {steps} {stop}": weight_ttt(steps, views)
       for steps, stop, views in ((30, "identity stop", 1), (60, "identity stop", 1), (30, "8-view stop", 8),
                                  (60, "2-view stop", 2), (20, "8-view stop", 8), (60, "8-view stop", 8),
                                  (100, "8-view stop", 8))},
    "view starts + all weights 60 8-view stop lr 3e-3": weight_ttt(60, 8, lr=3e-3),
    # bf16 autocast for the search, TTT and prediction of an fp32-trained checkpoint (--eval_only --amp bf16)
    "view starts + all weights 60 8-view stop bf16": {**weight_ttt(60, 8), "amp": "bf16"},
    **{f"view starts + all weights {steps} 8-view stop bf16 lr {lr}":
       {**weight_ttt(steps, 8, lr=float(lr)), "amp": "bf16"}
       for steps, lr in ((60, "3e-3"), (40, "3e-3"), (80, "3e-3"), (100, "3e-3"), (60, "2e-3"), (60, "5e-3"))},
    # the learning rate decayed to 0 over the steps (--ttt_schedule cosine), from the constant lrs above and higher
    **{f"view starts + all weights 60 8-view stop{' bf16' if amp else ''} lr {lr} cosine":
       {**weight_ttt(60, 8, lr=float(lr)), "ttt_schedule": "cosine", **({"amp": "bf16"} if amp else {})}
       for amp in (False, True) for lr in ("1e-3", "3e-3", "1e-2")},
    # the second half of the agent only (--ttt_params late): ~1.5x cheaper a step, so 90 steps cost what 60 did
    **{f"view starts + late half {steps} 8-view stop{' bf16' if amp else ''} lr {lr}":
       {**weight_ttt(steps, 8, lr=float(lr), params="late"), **({"amp": "bf16"} if amp else {})}
       for amp in (False, True) for lr in ("1e-3", "3e-3") for steps in (60, 90)},
}
# what `make bench-adapt` runs: not the bf16 cosine and late-half rows (pick them by --variants): bf16 is no
# faster on the unseen families' 10x10 canvases
UNSEEN_VARIANTS = ",".join(n for n in VARIANTS if not ("bf16" in n and ("cosine" in n or "late half" in n)))
# the training runs' own validations (every epoch) adapt nothing: the variants are the measurement
CHEAP_VALIDATION = {**VARIANTS["none"], "eval_augments": 1}
# a variant starts from the default validation, not from the training run's cheap one
EVAL_DEFAULTS = {name: value for name, value in Config().flags().items() if SECTION_OF[name] == "eval"}
TRANSDUCTIVE = {"train_on_eval_demos": True, "task_embedding": True}
ARC_VARIANTS = ("none,mean + view starts,all weights 30 steps (per task),"
                "view starts + all weights 30 steps,view starts + all weights 60 identity stop,"
                "view starts + all weights 60 8-view stop,view starts + all weights 60 8-view stop bf16,"
                "view starts + all weights 60 8-view stop bf16 lr 3e-3")


def chosen(names: str, flag: str) -> dict[str, dict]:
    """The variants a comma-separated list names; checked before any training starts."""
    unknown = [n for n in names.split(",") if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"{flag}: unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    return {n: VARIANTS[n] for n in names.split(",")}


def section(title: str, cfg, run_dir: Path, variants: dict[str, dict], common: dict,
            families: list[str] = ()) -> None:
    """One row per variant: exact (attempt 1), pass@2, oracle, seconds per task, weight-TTT steps per
    task (fewer than asked where the demos were solved first), and exact per synthetic family when
    `families` names them; then the copy-the-input baseline on the same tasks."""
    print(f"\n## {title}")
    print(f"{'method':<40}{'exact':>8}{'pass@2':>8}{'oracle':>8}{'s/task':>8}{'steps':>7}"
          + "".join(f"{f:>10}" for f in families))
    for name, flags in variants.items():
        by_family: dict[str, float] = {}
        m = evaluate_variant(cfg.replace(**{**EVAL_DEFAULTS, **common, **flags}), run_dir,
                             by_family if families else None)
        steps = f"{m['eval/ttt_steps_per_task']:.1f}" if "eval/ttt_steps_per_task" in m else "-"
        print(f"{name:<40}{fmt(m['eval/exact']):>8}{fmt(m['eval/pass2']):>8}{fmt(m['eval/oracle']):>8}"
              f"{m['eval/seconds_per_task']:>8.2f}{steps:>7}"
              + "".join(f"{fmt(by_family[f]) if f in by_family else '-':>10}" for f in families), flush=True)
    # the same tasks in every row (`chosen` never gives an empty list)
    print(f"{'copy the input (baseline)':<40}{fmt(m['eval/copy_exact']):>8}{fmt(m['eval/copy_pass2']):>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="unseen")
    ap.add_argument("--minutes", type=float, default=5.0, help="training budget of the unseen-families run")
    ap.add_argument("--tasks", type=int, default=100, help="held-out unseen-family tasks evaluated")
    ap.add_argument("--arc_minutes", type=float, default=30.0)
    ap.add_argument("--arc_tasks", type=int, default=50, help="ARC-AGI-1 evaluation tasks evaluated (the first N)")
    ap.add_argument("--eval_augments", type=int, default=8)
    ap.add_argument("--variants", default=UNSEEN_VARIANTS, help="comma-separated names of VARIANTS (unseen)")
    ap.add_argument("--arc_variants", default=ARC_VARIANTS, help="comma-separated names of VARIANTS (arc)")
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="take a finished run already in --out instead of training")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a fixed.py setting for the training runs and every variant")
    args = ap.parse_args()
    settings = parse_settings(args.set)
    unseen, arc = (chosen(args.variants, "--variants"), chosen(args.arc_variants, "--arc_variants"))
    sections = args.sections.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        if "unseen" in sections:
            cfg, summary, run_dir = run(args.minutes, root / "unseen", args.reuse, data="synthetic:2000",
                                        synthetic_rules=TRAIN_FAMILIES, synthetic_eval_rules=UNSEEN_FAMILIES,
                                        **{**CHEAP_VALIDATION, "eval_tasks": args.tasks, **settings})
            section(f"unseen rule families ({UNSEEN_FAMILIES}), first {args.tasks} held-out tasks, after "
                    f"{summary['seconds'] / 60:.1f} min ({summary['steps']} steps) on {TRAIN_FAMILIES}", cfg, run_dir,
                    unseen, {"eval_tasks": args.tasks, "eval_augments": args.eval_augments, **settings},
                    UNSEEN_FAMILIES.split(","))
        for name, transductive in (("arc", {}), ("arc-transductive", TRANSDUCTIVE)):
            if name not in sections:
                continue
            cfg, summary, run_dir = run(args.arc_minutes, root / name, args.reuse,
                                        **{**CHEAP_VALIDATION, "eval_tasks": args.arc_tasks, **transductive,
                                           **settings})
            # the run's own minutes: a --reuse'd run may have trained for another budget
            section(f"ARC-AGI-1 evaluation, first {args.arc_tasks} tasks, after {summary['seconds'] / 60:.1f} min "
                    f"({summary['steps']} steps){' with ' + str(transductive) if transductive else ''}", cfg, run_dir,
                    arc,
                    {"eval_tasks": args.arc_tasks, "eval_augments": args.eval_augments, **settings})


if __name__ == "__main__":
    main()
