"""Does the suite learn? Exact match on held-out tasks after a CPU time budget, as a table.

    python -m bench.learnability [--sections single,mixed,arc,rl] [--minutes 2] [--agents conv,rope]

Sections (each run is the real training loop of fixed.py, evaluated by its validation):
  single  one synthetic rule family per run (held-out instances of that family), for each agent
  mixed   all families mixed, the rule read from the demos through the prompt: exact on held-out
          tasks with the prompt, and with the prompt zeroed at evaluation (the gap is what the
          prompt carries)
  arc     ARC-AGI-1 evaluation after a run of `--arc_minutes`, next to the copy-the-input baseline
  rl      the reward curve of the mixed run, and validation with the sampled RL delta on and off

What adaptation and voted views buy on these runs: bench/frontier.py (`--set data=synthetic:2000`).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

import training
from agents import AGENTS
from data.synthetic import FAMILIES
from engine.checkpoint import find_checkpoint
from engine.config import SECTION_OF, Config
from engine.distributed import init_distributed
from engine.run_logger import read_scalars
from evaluation.evaluate import evaluate

CPU = torch.device("cpu")
# the unseen rule families: evaluated on held-out tasks of these, which training on the others never shows
UNSEEN_FAMILIES = "flip,transpose,scale,fill"
# a variant starts from the default validation, not from a training run's cheap one (no adaptation, one view)
EVAL_DEFAULTS = {name: value for name, value in Config().flags().items() if SECTION_OF[name] == "eval"}
CHEAP_VALIDATION = {"ttt_steps": 0, "ttt_small_steps": 0, "eval_augments": 1}


SETTINGS: dict = {}  # --set overrides, applied to every run


def parse_settings(pairs: list[str]) -> dict:
    """["agent_lr=1e-3", "input_views=false"] -> typed flag overrides."""
    defaults = Config().flags()
    out = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in SECTION_OF:
            raise SystemExit(f"--set {pair}: no such setting of fixed.py")
        kind = type(defaults[name])
        out[name] = text.lower() in ("1", "true", "yes") if kind is bool else kind(text)
    return out


def device_of(cfg: Config) -> torch.device:
    """The device a benchmark's runs train and score on: their --device as fixed.py resolves it (auto:
    CUDA where there is one), in this one process."""
    return init_distributed(cfg.run.device)[1]


def run(minutes: float, run_dir: Path, reuse: bool = False, **overrides) -> tuple[Config, dict, Path]:
    """Train for `minutes` into `run_dir`; with `reuse`, a finished run already there is taken as is."""
    cfg = Config.from_flags(epochs=1000, max_minutes=minutes, run_dir=str(run_dir), log_every=20,
                            prompt_cache_dir=str(run_dir.parent / "cache"), **{**SETTINGS, **overrides})
    if reuse and (run_dir / "summary.json").exists():
        return cfg, json.loads((run_dir / "summary.json").read_text()), run_dir
    return cfg, training.train(cfg, device_of(cfg)), run_dir


def evaluate_variant(cfg: Config, run_dir: Path | None, by_family: dict | None = None,
                     cache_dir: Path | None = None) -> dict:
    """Re-evaluate the run's final checkpoint (None: the weights as built) as `cfg` says
    (--eval_refinement mean/sampled/zero, eval augments, test-time training). With `by_family`, fill
    it with {synthetic family: first-attempt exact match}. `cache_dir`: the prompt cache (default: the
    run's sibling `cache`)."""
    checkpoint = find_checkpoint(str(run_dir)) if run_dir is not None else None
    cache = cache_dir if cache_dir is not None else run_dir.parent / "cache"
    device = device_of(cfg)
    data, state = training.load_run(cfg, checkpoint, device, cache_dir=cache)
    eval_set = data.eval_set
    result = evaluate(state.model, state.prompts, eval_set, cfg=cfg, device=device)
    metrics, submission = result.metrics, result.submission
    if by_family is not None:
        hits: dict[str, list[bool]] = {}
        tasks = {ep.task.task_id: ep.task for ep in eval_set.episodes}  # every evaluation task, not all scored
        for task_id, task_attempts in submission.items():
            family = task_id.rsplit("-", 1)[-1]
            for pair, attempts in zip(tasks[task_id].test, task_attempts, strict=True):
                hits.setdefault(family, []).append(np.array_equal(np.array(attempts["attempt_1"]), pair.output))
        by_family.update({f: float(np.mean(h)) for f, h in sorted(hits.items())})
    return metrics


def fmt(x: float) -> str:
    return f"{100 * x:5.1f}%"


def section_single(args, root: Path) -> None:
    print(f"\n## single rule family, {args.minutes} min each, held-out instances (exact match)")
    print(f"{'family':<10}" + "".join(f"{a + ' (steps)':>22}" for a in args.agents))
    for family in args.families:
        row = []
        for agent in args.agents:
            _, s, _ = run(args.minutes, root / f"single-{family}-{agent}", data=f"synthetic:{args.tasks}",
                          synthetic_rules=family, synthetic_eval_rules=family, agent=agent)
            row.append(f"{fmt(s['eval/exact'])} ({s['steps']})")
        print(f"{family:<10}" + "".join(f"{r:>22}" for r in row), flush=True)


def section_mixed(args, root: Path) -> list[tuple[str, Config, Path]]:
    print(f"\n## all families mixed, {args.mixed_minutes} min, held-out tasks (exact match)")
    print(f"{'agent':<14}{'with prompt':>14}{'prompt zeroed':>15}{'copy input':>12}{'steps':>8}")
    runs, families = [], {}
    for agent in args.agents:
        cfg, s, run_dir = run(args.mixed_minutes, root / f"mixed-{agent}", data=f"synthetic:{args.tasks}",
                              agent=agent)
        zeroed = evaluate_variant(cfg.replace(eval_refinement="zero"), run_dir)
        print(f"{agent:<14}{fmt(s['eval/exact']):>14}{fmt(zeroed['eval/exact']):>15}"
              f"{fmt(s['eval/copy_exact']):>12}{s['steps']:>8}", flush=True)
        evaluate_variant(cfg, run_dir, by_family=families.setdefault(agent, {}))
        runs.append((agent, cfg, run_dir))
    print("\nmixed runs by family (first attempt exact, held-out tasks)")
    print(f"{'family':<10}" + "".join(f"{a:>14}" for a in families))
    for family in next(iter(families.values()), {}):
        print(f"{family:<10}" + "".join(f"{fmt(f[family]):>14}" for f in families.values()))
    return runs


def section_arc(args, root: Path) -> None:
    print(f"\n## ARC-AGI-1 evaluation after {args.arc_minutes} min (400 tasks, 419 test pairs)")
    print(f"{'agent':<14}{'cell acc':>10}{'exact':>8}{'pass@2':>8}{'task score':>12}{'steps':>8}"
          f"   copy baseline cell acc / exact")
    for agent in args.agents:
        _, s, _ = run(args.arc_minutes, root / f"arc-{agent}", agent=agent)
        print(f"{agent:<14}{s['eval/cell_acc']:>10.3f}{s['eval/exact']:>8.3f}{s['eval/pass2']:>8.3f}"
              f"{s['eval/task_score']:>12.3f}{s['steps']:>8}   {s['eval/copy_cell_acc']:.3f} / "
              f"{s['eval/copy_exact']:.3f}", flush=True)


def section_rl(runs) -> None:
    print("\n## RL head on the mixed runs: reward (mean over each fifth of training), validation with/without the "
          "sampled delta")
    for agent, cfg, run_dir in runs:
        rewards = [value for _, value in read_scalars(run_dir)["rl/reward"]]
        fifth = max(1, math.ceil(len(rewards) / 5))
        curve = [sum(rewards[i:i + fifth]) / len(rewards[i:i + fifth]) for i in range(0, len(rewards), fifth)]
        sampled = evaluate_variant(cfg.replace(eval_refinement="sampled"), run_dir)
        mean = evaluate_variant(cfg.replace(eval_refinement="mean"), run_dir)
        print(f"{agent:<14} reward {' '.join(f'{r:+.4f}' for r in curve)} | exact with mean delta "
              f"{fmt(mean['eval/exact'])}, with sampled delta {fmt(sampled['eval/exact'])}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="single,mixed,arc,rl")
    ap.add_argument("--agents", default=",".join(AGENTS), help="agents compared (default: every one)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--tasks", type=int, default=2000, help="synthetic training tasks (n/4 held out)")
    ap.add_argument("--minutes", type=float, default=1.5, help="budget of each single-family run")
    ap.add_argument("--mixed_minutes", type=float, default=7.0)
    ap.add_argument("--arc_minutes", type=float, default=10.0)
    ap.add_argument("--out", default="", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a fixed.py setting for every run, e.g. --set agent_lr=1e-3 --set input_views=false")
    args = ap.parse_args()
    SETTINGS.update(parse_settings(args.set))
    args.agents, args.families = args.agents.split(","), args.families.split(",")
    sections = args.sections.split(",")
    unknown = set(sections) - {"single", "mixed", "arc", "rl"}
    if unknown:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from single, mixed, arc, rl")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        if "single" in sections:
            section_single(args, root)
        mixed = section_mixed(args, root) if {"mixed", "rl"} & set(sections) else []
        if "arc" in sections:
            section_arc(args, root)
        if "rl" in sections:
            section_rl(mixed)


if __name__ == "__main__":
    main()
