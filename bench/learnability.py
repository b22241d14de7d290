"""Does the suite learn? Exact match on held-out tasks after a CPU time budget, as a table.

    python -m bench.learnability [--sections single,mixed,arc,rl] [--minutes 2] [--agents conv,transformer]

Sections (each run is the real training loop of fixed.py, evaluated by its validation):
  single  one synthetic rule family per run (held-out instances of that family), for each agent
  mixed   all families mixed, the rule read from the demos through the prompt: exact on held-out
          tasks with the prompt, and with the prompt zeroed at evaluation (the gap is what the
          prompt carries)
  arc     ARC-AGI-1 evaluation after a run of `--arc_minutes`, next to the copy-the-input baseline
  rl      the reward curve of the mixed run, and validation with the sampled RL delta on and off
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fixed
from data.synthetic import FAMILIES
from engine.checkpoint import resolve_checkpoint
from engine.distributed import Dist
from engine.evaluation import evaluate
from engine.run_state import restore_run_state

CPU = torch.device("cpu")


def run(minutes: float, run_dir: Path, **overrides) -> tuple[fixed.TrainConfig, dict, Path]:
    cfg = fixed.TrainConfig(epochs=1000, max_minutes=minutes, run_dir=str(run_dir), log_every=20,
                            prompt_cache_dir=str(run_dir.parent / "cache"), **overrides)
    return cfg, fixed.train(cfg, CPU), run_dir


def evaluate_variant(cfg: fixed.TrainConfig, run_dir: Path, variant: str) -> dict:
    """Re-evaluate the run's final checkpoint with the prompt zeroed, or with the sampled RL delta."""
    fixed.seed_everything(cfg.seed)
    _, _, _, eval_set = fixed.build_loaders(cfg, CPU)
    parts = fixed.build_parts(cfg, CPU, run_dir.parent / "cache")
    restore_run_state(parts, resolve_checkpoint(str(run_dir)), dataclasses.asdict(cfg), Dist())
    if variant == "zero prompt":
        parts.policy.refine_mean = lambda prompt, ctrl, feat: torch.zeros_like(prompt)
    elif variant == "sampled delta":
        parts.policy.refine_mean = lambda prompt, ctrl, feat: parts.policy.refine_prompt(prompt, ctrl, feat)[0]
    return evaluate(parts, eval_set, cfg.eval_cfg(), cfg.coefs(), 10**9, CPU)[0]


def fmt(x: float) -> str:
    return f"{100 * x:5.1f}%"


def section_single(args, root: Path) -> None:
    print(f"\n## single rule family, {args.minutes} min each, held-out instances (exact match)")
    print(f"{'family':<10}" + "".join(f"{a:>14}" for a in args.agents) + f"{'steps':>8}")
    for family in args.families:
        row, steps = [], 0
        for agent in args.agents:
            _, s, _ = run(args.minutes, root / f"single-{family}-{agent}", data=f"synthetic:{args.tasks}",
                          synthetic_rules=family, synthetic_eval_rules=family, agent=agent)
            row.append(fmt(s["eval/exact"]))
            steps = s["steps"]
        print(f"{family:<10}" + "".join(f"{r:>14}" for r in row) + f"{steps:>8}", flush=True)


def section_mixed(args, root: Path) -> list[tuple[str, fixed.TrainConfig, Path]]:
    print(f"\n## all families mixed, {args.mixed_minutes} min, held-out tasks (exact match)")
    print(f"{'agent':<14}{'with prompt':>14}{'prompt zeroed':>15}{'copy input':>12}{'steps':>8}")
    runs = []
    for agent in args.agents:
        cfg, s, run_dir = run(args.mixed_minutes, root / f"mixed-{agent}", data=f"synthetic:{args.tasks}",
                              agent=agent)
        zeroed = evaluate_variant(cfg, run_dir, "zero prompt")
        print(f"{agent:<14}{fmt(s['eval/exact']):>14}{fmt(zeroed['eval/exact']):>15}"
              f"{fmt(s['eval/copy_exact']):>12}{s['steps']:>8}", flush=True)
        runs.append((agent, cfg, run_dir))
    return runs


def section_arc(args, root: Path) -> None:
    print(f"\n## ARC-AGI-1 evaluation after {args.arc_minutes} min (400 tasks, 419 test pairs)")
    print(f"{'agent':<14}{'cell acc':>10}{'exact':>8}{'task score':>12}   copy baseline cell acc / exact")
    for agent in args.agents:
        _, s, _ = run(args.arc_minutes, root / f"arc-{agent}", agent=agent)
        print(f"{agent:<14}{s['eval/cell_acc']:>10.3f}{s['eval/exact']:>8.3f}{s['eval/task_score']:>12.3f}"
              f"   {s['eval/copy_cell_acc']:.3f} / {s['eval/copy_exact']:.3f}", flush=True)


def section_rl(runs) -> None:
    print("\n## RL head on the mixed runs: reward (mean over each fifth of training), validation with/without the "
          "sampled delta")
    for agent, cfg, run_dir in runs:
        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        rewards = [e.value for e in acc.Scalars("rl/reward")]
        fifth = max(1, math.ceil(len(rewards) / 5))
        curve = [sum(rewards[i:i + fifth]) / len(rewards[i:i + fifth]) for i in range(0, len(rewards), fifth)]
        sampled = evaluate_variant(cfg, run_dir, "sampled delta")
        mean = evaluate_variant(cfg, run_dir, "mean delta")
        print(f"{agent:<14} reward {' '.join(f'{r:+.4f}' for r in curve)} | exact with mean delta "
              f"{fmt(mean['eval/exact'])}, with sampled delta {fmt(sampled['eval/exact'])}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="single,mixed,arc,rl")
    ap.add_argument("--agents", default="conv,transformer")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--tasks", type=int, default=2000, help="synthetic training tasks (n/4 held out)")
    ap.add_argument("--minutes", type=float, default=3.0, help="budget of each single-family run")
    ap.add_argument("--mixed_minutes", type=float, default=7.0)
    ap.add_argument("--arc_minutes", type=float, default=10.0)
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    args.agents, args.families = args.agents.split(","), args.families.split(",")
    sections = args.sections.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        if "single" in sections:
            section_single(args, root)
        runs = section_mixed(args, root) if "mixed" in sections or "rl" in sections else []
        if "arc" in sections:
            section_arc(args, root)
        if "rl" in sections:
            section_rl(runs)


if __name__ == "__main__":
    main()
