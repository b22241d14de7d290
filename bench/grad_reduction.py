"""Gradient reduction of two gloo processes: torch's DDP against the suite's hand reduction.

    python -m bench.grad_reduction [--steps 10]

For each shape (the tiny encoder; the Qwen2.5-0.5B shape with LoRA, re-encoding every step so
its adapters have gradients every step), `torchrun --nproc_per_node 2` runs `train_step` with the
hand reduction (`--grad_reduce hand`) one call per gradient tensor (`--grad_bucket_mb 0`) and in
25 MiB buckets, then with DDP (25 MiB buckets, the default), and prints the all-reduce calls a step
(every one the profiler saw: gradients and the loop's small control collectives), the time spent
in the hand reduction's `step/reduce` phase (DDP reduces inside backward: none), and the whole step
(rank 0, after one warm-up step). On one machine gloo copies through memory, so the call count is
what carries over to a network; the times show what a call costs here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

import fixed
from engine.config import Config
from engine.distributed import init_distributed, shutdown
from engine.loop import epoch_windows

SHAPES = {
    "tiny": {},
    "Qwen2.5-0.5B LoRA": {"qwen_model": "random:Qwen/Qwen2.5-0.5B", "qwen_train": "lora", "prompt_refresh": 1,
                          "max_prompt_tokens": 64, "batch_size": 2},
}


REDUCTIONS = {"hand, per tensor": ("hand", 0.0), "hand, 25 MiB buckets": ("hand", 25.0), "DDP, 25 MiB": ("ddp", 25.0)}


def worker(shape: str, reduction: str, steps: int) -> None:
    """Runs under torchrun: `steps` + 1 training steps; rank 0 prints one JSON line."""
    grad_reduce, bucket_mb = REDUCTIONS[reduction]
    cfg = Config.from_flags(data="synthetic:200", synthetic_size="3-6", grad_bucket_mb=bucket_mb,
                            grad_reduce=grad_reduce, **SHAPES[shape])
    dist, device = init_distributed("cpu")
    fixed.seed_everything(cfg.run.seed)
    data = fixed.build_data(cfg, device, dist)
    state = fixed.build_train_state(cfg, device, dist)
    data.sampler.set_epoch(0)
    windows = epoch_windows(data.loader, steps + 1, 1, device)
    stats = fixed.train_step(state, next(windows), cfg, dist)  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for window in windows:
            stats = fixed.train_step(state, window, cfg, dist)
    seconds = (time.perf_counter() - start) / steps
    events = prof.key_averages()
    reduce_s = sum(e.cpu_time_total for e in events if e.key == "step/reduce") / 1e6 / steps
    calls = sum(e.count for e in events if e.key.endswith(":all_reduce")) / steps  # the backend's (gloo, nccl) events
    if dist.is_main:
        print(json.dumps({"calls": calls, "step_s": seconds, "reduce_s": reduce_s,
                          "tensors": sum(len(g["params"]) for g in state.optimizer.param_groups)}))
    del state  # DDP's reducer goes before its process group
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--worker", nargs=2, metavar=("SHAPE", "REDUCTION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.steps)
        return
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    print(f"## two gloo processes, {args.steps} steps, {os.cpu_count()} CPU cores")
    print(f"{'shape':<20}{'reduction':<22}{'tensors':>9}{'all-reduces/step':>18}{'reduce ms':>11}{'step ms':>10}")
    for shape in args.shapes.split(","):
        for name in REDUCTIONS:
            out = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "bench.grad_reduction", "--worker", shape,
                                  name, "--steps", str(args.steps)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{shape}, {name}: worker failed\n{out.stderr[-2000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{shape:<20}{name:<22}{r['tensors']:>9}{r['calls']:>18.1f}{1e3 * r['reduce_s']:>11.1f}"
                  f"{1e3 * r['step_s']:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
