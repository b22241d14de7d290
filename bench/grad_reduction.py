"""Gradient reduction of two gloo processes: one all-reduce per tensor against flattened buckets.

    python -m bench.grad_reduction [--steps 10]

For each shape (the tiny encoder; the Qwen2.5-0.5B shape with LoRA, re-encoding every step so
its adapters have gradients every step), `torchrun --nproc_per_node 2` runs `train_step` with
`--grad_bucket_mb 0` (one call per gradient tensor, as before) and 25 (the default), and prints the
collective calls and the time of the reduction and of the whole step (rank 0, after one warm-up
step). On one machine gloo copies through memory, so the call count is what carries over to a
network; the times show what a call costs here.
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


def worker(shape: str, bucket_mb: float, steps: int) -> None:
    """Runs under torchrun: `steps` + 1 training steps; rank 0 prints one JSON line."""
    cfg = Config.from_flags(data="synthetic:200", synthetic_size="3-6", grad_bucket_mb=bucket_mb, **SHAPES[shape])
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
    reduce_s = sum(e.cpu_time_total for e in prof.key_averages() if e.key == "step/reduce") / 1e6 / steps
    if dist.is_main:
        print(json.dumps({"collectives": stats["dist/collectives"], "step_s": seconds, "reduce_s": reduce_s,
                          "tensors": sum(len(g["params"]) for g in state.optimizer.param_groups)}))
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--worker", nargs=2, metavar=("SHAPE", "BUCKET_MB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], float(args.worker[1]), args.steps)
        return
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    print(f"## two gloo processes, {args.steps} steps, {os.cpu_count()} CPU cores")
    print(f"{'shape':<20}{'reduction':<14}{'tensors':>9}{'calls/step':>12}{'reduce ms':>11}{'step ms':>10}")
    for shape in args.shapes.split(","):
        for bucket_mb, name in ((0, "per tensor"), (25, "25 MiB buckets")):
            out = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "bench.grad_reduction", "--worker", shape,
                                  str(bucket_mb), "--steps", str(args.steps)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{shape}, {name}: worker failed\n{out.stderr[-2000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{shape:<20}{name:<14}{r['tensors']:>9}{r['collectives']:>12.0f}{1e3 * r['reduce_s']:>11.1f}"
                  f"{1e3 * r['step_s']:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
