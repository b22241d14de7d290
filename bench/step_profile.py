"""Where a training step's time goes: per phase, per agent, at two canvas sides; fp32 against bf16
and eager against `--compile`, in one run.

    python -m bench.step_profile [--steps 30] [--agents conv,transformer] [--sides 11,30]

Each case trains the default configuration on synthetic tasks whose grids (and so canvases) have
one size: side 11 (10x10 grids plus the end-of-grid row) and side 30 (29x29). The whole step is
timed as the loop runs it (next batch from the loader, `train_step`, the logger), twice over the
same windows: with the prompt cache cold, then warm (a long run's steady state); a third pass
under torch.profiler splits the warm `train_step` into its `record_function` phases (step/prompt,
forward, backward, reduce, optimizer, rl). The bare agent is one forward and backward of the agent alone on
the same batch (doubled, as the step runs both refinements) with a fixed prompt: loop overhead =
1 - bare / whole warm step, everything that is not the agent's own arithmetic.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import fixed
from engine.config import Config
from engine.loop import epoch_windows
from engine.run_logger import RunLogger

CPU = torch.device("cpu")
SIZES = {11: "10-10", 30: "29-29"}  # canvas side -> synthetic grid sides
SAME_SIZE_RULES = "recolour,flip,rotate,transpose,gravity"  # outputs as large as inputs: one canvas side
PHASES = ("step/prompt", "step/forward", "step/backward", "step/reduce", "step/optimizer", "step/rl")


def case_config(agent: str, side: int, **flags) -> Config:
    return Config.from_flags(agent=agent, data="synthetic:200", synthetic_size=SIZES[side],
                             synthetic_rules=SAME_SIZE_RULES, synthetic_eval_rules=SAME_SIZE_RULES, **flags)


def timed_steps(cfg: Config, steps: int, warmup: int, log_dir: Path) -> dict:
    """Run the loop's own pieces on `warmup` + `steps` windows, then the same `steps` windows again.
    -> seconds per step of each piece: data (the loader), train_step with the prompt cache cold
    (first sight of each demo x augmentation: the tiny Qwen encodes it) and warm (the same windows
    again: every feature read from the cache, as in a long run once the augmentation pool has been
    seen), logging; phase seconds per step of the warm pass (profiled); the canvas side and a batch."""
    fixed.seed_everything(cfg.run.seed)
    data = fixed.build_data(cfg, CPU)
    state = fixed.build_train_state(cfg, CPU)
    logger = RunLogger(log_dir, cfg.flags(), "bench")
    data.sampler.set_epoch(0)
    batches = epoch_windows(data.loader, cfg.optim.grad_accum * (warmup + steps), cfg.optim.grad_accum, CPU)
    windows, data_seconds = [], 0.0
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        windows.append(next(batches))
        data_seconds += (time.perf_counter() - t0) * (i >= warmup)
    for window in windows[:warmup]:
        fixed.train_step(state, window, cfg)
    took = {"data": data_seconds / steps}
    for cache in ("cold", "warm"):
        step_seconds = log_seconds = 0.0
        for window in windows[warmup:]:
            t0 = time.perf_counter()
            stats = fixed.train_step(state, window, cfg)
            t1 = time.perf_counter()
            logger.accumulate(stats)
            if state.counters.optimizer_steps % cfg.run.log_every == 0:
                logger.flush(state.counters.optimizer_steps)
            step_seconds, log_seconds = step_seconds + t1 - t0, log_seconds + time.perf_counter() - t1
        took[f"train_step_{cache}"], took["logging"] = step_seconds / steps, log_seconds / steps
    logger.close()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for window in windows[warmup:]:
            fixed.train_step(state, window, cfg)
    by_name = {e.key: e.cpu_time_total / 1e6 / steps for e in prof.key_averages() if e.key in PHASES}
    batch = windows[-1][0]
    return {**took, "phases": by_name, "side": batch["input"].shape[-1], "batch": batch, "state": state}


def bare_agent(state, batch: dict, prompt_dim: int, repeats: int) -> float:
    """Seconds of one agent forward + backward on the doubled batch, prompt fixed."""
    agent = state.model.agent
    grid = torch.cat([batch["input"], batch["input"]])
    prompt = torch.randn(grid.shape[0], prompt_dim)
    for warm in (True, False):
        start = time.perf_counter()
        for _ in range(2 if warm else repeats):
            with state.amp.autocast():
                loss = agent(grid, prompt).float().logsumexp(-1).mean()
            loss.backward()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--agents", default="conv,transformer")
    ap.add_argument("--sides", default="11,30")
    ap.add_argument("--variants", default="fp32,bf16,compile", help="fp32 (the default), bf16 (--amp bf16), "
                    "compile (--compile)")
    args = ap.parse_args()
    flags = {"fp32": {}, "bf16": {"amp": "bf16"}, "compile": {"compile": True}}
    print(f"## step time per phase, ms (batch 8, {args.steps} steps after {args.warmup} warm-up, "
          f"{torch.get_num_threads()} CPU threads; phases from the warm pass)")
    head = ["agent", "S", "variant", "step cold", "step warm", "data", "prompt", "forward", "backward", "optim",
            "rl", "logging", "bare agent", "overhead"]
    print("".join(f"{h:>11}" for h in head))
    with tempfile.TemporaryDirectory() as tmp:
        for agent in args.agents.split(","):
            for side in map(int, args.sides.split(",")):
                for variant in args.variants.split(","):
                    cfg = case_config(agent, side, **flags[variant])
                    r = timed_steps(cfg, args.steps, args.warmup, Path(tmp) / f"{agent}{side}{variant}")
                    cold, warm = (r["data"] + r[f"train_step_{c}"] + r["logging"] for c in ("cold", "warm"))
                    bare = bare_agent(r["state"], r["batch"], cfg.prompt.prompt_dim, 5)
                    ph = r["phases"]
                    cells = [agent, r["side"], variant] + [f"{1e3 * x:.1f}" for x in (
                        cold, warm, r["data"], ph.get("step/prompt", 0), ph.get("step/forward", 0),
                        ph.get("step/backward", 0), ph.get("step/optimizer", 0), ph.get("step/rl", 0),
                        r["logging"], bare)] + [f"{1 - bare / warm:.0%}"]
                    print("".join(f"{c:>11}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
