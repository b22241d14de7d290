"""Where a training step's time goes: per phase, per agent, at two canvas sides; fp32 against bf16,
loader workers, and eager against `--compile` (with `--canvas bucket`), in one run.

    python -m bench.step_profile [--steps 15] [--agents conv,rope] [--sides 11,30]

Each case trains the default configuration on synthetic tasks whose grids (and so canvases) have
one size: side 11 (10x10 grids plus the end-of-grid row) and side 30 (29x29). The whole step is
timed as the loop runs it (next batch from the loader, `train_step`, the logger), twice over the
same windows: with the prompt cache cold, then warm (a long run's steady state); a third pass
under torch.profiler splits the warm `train_step` into its `record_function` phases (step/prompt,
forward, backward (with DDP's reduction), optimizer, rl). The bare agent is one forward and backward of the agent
alone on the same batch (doubled, as the step runs both refinements) with a fixed prompt and the
enclosed-background map the loader made (data/enclosed.py), timed right after each warm step: loop
overhead = 1 - bare / whole warm step, everything that is not the agent's own arithmetic.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import training
from agents import AGENTS
from engine.config import Config
from engine.distributed import Dist
from engine.loop import epoch_windows
from engine.precision import slow_precision
from engine.run_logger import IntervalMeans, RunLogger

CPU = torch.device("cpu")
SIZES = {11: "10-10", 30: "29-29"}  # canvas side -> synthetic grid sides
SAME_SIZE_RULES = "recolour,flip,rotate,transpose,gravity"  # outputs as large as inputs: one canvas side
PHASES = ("step/prompt", "step/forward", "step/backward", "step/optimizer", "step/rl")


def case_config(agent: str, side: int, tasks: int = 200, **flags) -> Config:
    """The default configuration with `agent` on `tasks` synthetic tasks of one grid size (side `side`)."""
    return Config.from_flags(agent=agent, data=f"synthetic:{tasks}", synthetic_size=SIZES[side],
                             synthetic_rules=SAME_SIZE_RULES, synthetic_eval_rules=SAME_SIZE_RULES, **flags)


def clock(device: torch.device) -> float:
    """perf_counter once the device has finished what was queued (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def loop_pass(state, data, cfg: Config, logger: RunLogger, *, warmup: int, steps: int, bare: bool = False,
              device: torch.device = CPU) -> dict:
    """The loop's own pieces over epoch 0's first `warmup` + `steps` windows (the sampler makes the
    same windows on every pass). -> seconds per timed step: data (waiting for the loader, which
    prefetches with --num_workers), train_step, logging, and with `bare` the bare agent on the
    step's own batch right after it (interleaved, so both see the machine in the same state); each
    the median over the timed steps."""
    data.sampler.set_epoch(0)
    windows = epoch_windows(data.loader, cfg.optim.grad_accum * (warmup + steps), cfg.optim.grad_accum, device)
    took: dict = {"data": [], "train_step": [], "logging": [], "bare": []}
    interval = IntervalMeans()
    for i in range(warmup + steps):
        t0 = clock(device)
        window = next(windows)
        t1 = clock(device)
        stats = training.train_step(state, window, cfg)
        t2 = clock(device)
        interval.add(stats)
        if state.counters.optimizer_steps % cfg.run.log_every == 0:
            logger.write(state.counters.optimizer_steps, interval.means(Dist()))
        t3 = clock(device)
        if i >= warmup:
            for key, seconds in (("data", t1 - t0), ("train_step", t2 - t1), ("logging", t3 - t2)):
                took[key].append(seconds)
            if bare:
                took["bare"].append(bare_agent(state, window[0], cfg.prompt.prompt_dim))
    # medians: on a shared machine noise only ever adds time, and a mean takes all of it
    return {**{k: float(np.median(v)) if v else float("nan") for k, v in took.items()}, "batch": window[0]}


def bare_agent(state, batch: dict, prompt_dim: int) -> float:
    """Seconds of one agent forward + backward on the doubled batch (the step runs both
    refinements in one call), prompt fixed; the gradients it leaves are dropped."""
    agent = state.model.agent
    grid = torch.cat([batch["input"], batch["input"]])
    enclosed = torch.cat([batch["input_enclosed"], batch["input_enclosed"]])  # the loader's, as in the step
    prompt = torch.randn(grid.shape[0], prompt_dim, device=grid.device)
    start = clock(grid.device)
    with state.amp.autocast():
        loss = agent(grid, prompt, None, enclosed).float().logsumexp(-1).mean()
    loss.backward()
    took = clock(grid.device) - start
    agent.zero_grad(set_to_none=True)
    return took


def bare_agent_flops(state, batch: dict, prompt_dim: int) -> int:
    """FLOPs of what `bare_agent` times (torch's FlopCounterMode: matrix products and convolutions,
    forward and backward)."""
    with FlopCounterMode(display=False) as counter:
        bare_agent(state, batch, prompt_dim)
    return counter.get_total_flops()


def timed_steps(cfg: Config, steps: int, warmup: int, log_dir: Path, device: torch.device = CPU,
                phases: bool = True) -> dict:
    """Two passes over the same windows: the prompt cache cold (first sight of each demo x
    augmentation: the tiny Qwen encodes it), then warm (every feature read from the cache, as in a
    long run once the augmentation pool has been seen); with `phases` a third, profiled, splits the
    warm `train_step` into its phases (host time: on a CPU the phases' own). -> {"cold": pass,
    "warm": pass, "phases": seconds per step, ...}"""
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, device)
    state = training.build_train_state(cfg, device, tasks=len(data.task_ids))  # --task_embedding's rows
    logger = RunLogger(log_dir, cfg.flags(), "bench")
    cold = loop_pass(state, data, cfg, logger, warmup=warmup, steps=steps, device=device)
    warm = loop_pass(state, data, cfg, logger, warmup=warmup, steps=steps, bare=True, device=device)
    logger.close()
    by_name: dict[str, float] = {}
    if phases:
        data.sampler.set_epoch(0)
        windows = list(epoch_windows(data.loader, cfg.optim.grad_accum * (warmup + steps), cfg.optim.grad_accum,
                                     device))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for window in windows[warmup:]:
                training.train_step(state, window, cfg)
        events = recorded(prof)
        by_name = phase_seconds(events, steps)
        by_name.update(device_activity(events, steps))
    return {"cold": cold, "warm": warm, "phases": by_name, "side": warm["batch"]["input"].shape[-1], "state": state}


class RecordedEvent(NamedTuple):
    name: str
    device: torch.autograd.DeviceType
    seconds: float
    annotation: bool  # a record_function range (on CUDA also its GPU-side copy), not an operator or kernel


def recorded(prof: profile) -> list[RecordedEvent]:
    """Every event `prof` recorded, as (name, device, seconds, user annotation).

    Read from the profiler's raw (kineto) events: `prof.key_averages()` first builds a FunctionEvent
    and its call tree for each of them (1.0 s against 5 ms for 20,000 CPU events here), where the
    sums below read only names, devices and durations (tests/test_step_profile.py checks them
    against key_averages)."""
    return [RecordedEvent(e.name(), e.device_type(), e.duration_ns() / 1e9, e.is_user_annotation())
            for e in prof.profiler.kineto_results.events()]


def phase_seconds(events: list[RecordedEvent], steps: int) -> dict[str, float]:
    """Host seconds per step in each of PHASES (on CUDA each phase is also a GPU-side annotation of
    the same name: the host's is the CPU one)."""
    seconds = dict.fromkeys(PHASES, 0.0)
    for e in events:
        if e.name in seconds and e.device == torch.autograd.DeviceType.CPU:
            seconds[e.name] += e.seconds
    return {name: total / steps for name, total in seconds.items() if total}


def device_activity(events: list[RecordedEvent], steps: int) -> dict[str, float]:
    """What a profiled step asked of the device, per step: "kernels" (launches), "gpu busy" (seconds
    of kernel time), "syncs" (calls that may block the host until the device is done: stream, event
    and device synchronizations, and the cudaMemcpy* calls, inside which a device-to-host copy
    waits; a copy from pinned memory to the device does not) and "sync wait" (seconds the host
    spent inside those calls: what they cost). None of them exist on a CPU (zeros): there the step
    is host time only."""
    launches = sum("LaunchKernel" in e.name for e in events)
    blocking = [e for e in events if "Synchronize" in e.name or e.name.startswith("cudaMemcpy")]
    busy = sum(e.seconds for e in events  # kernels and copies, not the phases' annotated spans
               if e.device == torch.autograd.DeviceType.CUDA and not e.annotation)
    return {"kernels": launches / steps, "gpu busy": busy / steps, "syncs": len(blocking) / steps,
            "sync wait": sum(e.seconds for e in blocking) / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--agents", default=",".join(AGENTS), help="agents compared (default: every one)")
    ap.add_argument("--sides", default="11,30")
    ap.add_argument("--variants", default="fp32,bf16,workers,compile",
                    help="fp32 (the default), bf16 (--amp bf16), workers (--num_workers 1: the loader prefetches "
                         "in a process), compile (--compile --canvas bucket: each canvas side compiled once)")
    args = ap.parse_args()
    flags = {"fp32": {}, "bf16": {"amp": "bf16"}, "workers": {"num_workers": 1},
             "compile": {"compile": True, "canvas": "bucket"}}
    print(f"## step time per phase, ms (batch 8, {args.steps} steps after {args.warmup} warm-up, "
          f"{torch.get_num_threads()} CPU threads; phases from the warm pass)")
    head = ["agent", "S", "variant", "step cold", "step warm", "data", "prompt", "forward", "backward", "optim",
            "rl", "logging", "bare agent", "overhead"]
    print("".join(f"{h:>11}" for h in head))
    with tempfile.TemporaryDirectory() as tmp:
        for agent in args.agents.split(","):
            for side in map(int, args.sides.split(",")):
                for variant in args.variants.split(","):
                    slow = slow_precision(flags[variant].get("amp", "off"), torch.device("cpu"))
                    if slow:  # emulated bf16: the S = 30 row took over 10 minutes on such a CPU
                        print(f"{agent:>11}{side:>11}{variant:>11}  skipped: {slow.removeprefix('warning: ')}")
                        continue
                    torch._dynamo.reset()  # each case compiles afresh
                    cfg = case_config(agent, side, **flags[variant])
                    r = timed_steps(cfg, args.steps, args.warmup, Path(tmp) / f"{agent}{side}{variant}")
                    cold, warm = (sum(r[p][k] for k in ("data", "train_step", "logging")) for p in ("cold", "warm"))
                    bare = r["warm"]["bare"]
                    ph = r["phases"]
                    cells = [agent, r["side"], variant] + [f"{1e3 * x:.1f}" for x in (
                        cold, warm, r["warm"]["data"], ph.get("step/prompt", 0), ph.get("step/forward", 0),
                        ph.get("step/backward", 0), ph.get("step/optimizer", 0), ph.get("step/rl", 0),
                        r["warm"]["logging"], bare)] + [f"{1 - bare / warm:.0%}"]
                    print("".join(f"{c:>11}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
