"""Data parallelism on two gloo processes: collective calls, step time and per-process bytes.

    python -m bench.grad_reduction [--steps 10] [--shapes tiny,"Qwen2.5-0.5B LoRA"]

For each shape (the tiny encoder; the Qwen2.5-0.5B shape with LoRA, re-encoding every step so its
adapters have gradients every step; in full, two such processes need more than 24 GiB), `torchrun --nproc_per_node 2` runs `train_step` under
DDP (25 MiB buckets) and prints the all-reduce calls a step (every one the profiler saw: DDP's
buckets and the loop's small control collectives), the step time (rank 0, after one warm-up
step), and what one process holds of Qwen: parameters + gradients + AdamW state, in bytes (under
DDP, all of it on every process). On one machine gloo copies through memory, so the call count is
what carries over to a network; the times show what a call costs here. The suite's own bucketed
reduction was measured against DDP before it went: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
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
MiB = 1 << 20


def qwen_bytes(state) -> int:
    """Bytes this process holds of Qwen: its parameters, their gradients (as after backward: one per
    trainable parameter) and the AdamW state of the trainable ones."""
    params = list(state.model.qwen.parameters()) if state.model.qwen is not None else []
    held = sum(p.numel() * p.element_size() for p in params)
    held += sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    held += sum(v.numel() * v.element_size() for p in params if p in state.optimizer.state
                for v in state.optimizer.state[p].values() if torch.is_tensor(v))
    return held


def worker(shape: str, steps: int) -> None:
    """Runs under torchrun: `steps` + 1 training steps; rank 0 prints one JSON line."""
    cfg = Config.from_flags(data="synthetic:200", synthetic_size="3-6", **SHAPES[shape])
    dist, device = init_distributed("cpu")
    fixed.seed_everything(cfg.run.seed)
    data = fixed.build_data(cfg, device, dist)
    state = fixed.build_train_state(cfg, device, dist)
    data.sampler.set_epoch(0)
    windows = epoch_windows(data.loader, steps + 1, 1, device)
    fixed.train_step(state, next(windows), cfg, dist)  # warm-up; AdamW's state exists from here
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for window in windows:
            fixed.train_step(state, window, cfg, dist)
    seconds = (time.perf_counter() - start) / steps
    calls = sum(e.count for e in prof.key_averages() if e.key.endswith(":all_reduce")) / steps  # gloo's, nccl's
    if dist.is_main:
        print(json.dumps({"calls": calls, "step_s": seconds, "qwen_bytes": qwen_bytes(state),
                          "tensors": sum(len(g["params"]) for g in state.optimizer.param_groups)}))
    del state  # DDP's reducer goes before its process group
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--worker", metavar="SHAPE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    print(f"## two gloo processes under DDP, {args.steps} steps, {os.cpu_count()} CPU cores")
    print(f"{'shape':<20}{'tensors':>9}{'all-reduces/step':>18}{'step ms':>10}{'Qwen MiB/process':>18}")
    for shape in args.shapes.split(","):
        out = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "bench.grad_reduction", "--worker", shape,
                              "--steps", str(args.steps)], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{shape}: worker failed\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{shape:<20}{r['tensors']:>9}{r['calls']:>18.1f}{1e3 * r['step_s']:>10.0f}"
              f"{r['qwen_bytes'] / MiB:>18,.0f}", flush=True)


if __name__ == "__main__":
    main()
