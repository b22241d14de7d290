"""Data parallelism on two gloo processes, DDP and FSDP: collective calls, step time, per-process bytes.

    python -m bench.grad_reduction [--steps 10] [--runs "tiny/ddp,tiny/fsdp,..."]

For each shape (the tiny encoder; the Qwen2.5-0.5B shape with LoRA and in full, re-encoding every
step so Qwen has gradients every step) and engine, `torchrun --nproc_per_node 2` runs `train_step`
and prints the collective calls a step (every all-reduce, all-gather and reduce-scatter the
profiler saw: DDP's buckets or FSDP's gathers and scatters, and the loop's small control
collectives), the step time (rank 0, after one warm-up step), and what one process holds of Qwen:
parameters + gradients + AdamW state, in bytes (under DDP all of it on every process; under FSDP
this process's shards). On one machine gloo copies through memory, so the call count is what
carries over to a network; the times show what a call costs here. The 0.5B shape in full under
DDP needs more than this machine's 24 GiB for two processes: FSDP only. The suite's own bucketed
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
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

import training
from engine.config import Config
from engine.distributed import init_distributed, shutdown
from engine.loop import epoch_windows

QWEN_05B = {"qwen_model": "random:Qwen/Qwen2.5-0.5B", "prompt_refresh": 1, "max_prompt_tokens": 64, "batch_size": 2}
SHAPES = {
    "tiny": {},
    "0.5B LoRA": {**QWEN_05B, "qwen_train": "lora"},
    "0.5B full": {**QWEN_05B, "qwen_train": "full"},
}
RUNS = "tiny/ddp,tiny/fsdp,0.5B LoRA/ddp,0.5B LoRA/fsdp,0.5B full/fsdp"
COLLECTIVES = ("all_reduce", "all_gather", "allgather", "reduce_scatter")
MiB = 1 << 20


def held(t: torch.Tensor) -> int:
    """Bytes this process holds of `t` (its shard of a DTensor)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def qwen_bytes(state) -> int:
    """Bytes this process holds of Qwen: its parameters, their gradients (as after backward: one per
    trainable parameter) and the AdamW state of the trainable ones."""
    params = list(state.model.qwen.parameters()) if state.model.qwen is not None else []
    return (sum(held(p) for p in params) + sum(held(p) for p in params if p.requires_grad)
            + sum(held(v) for p in params if p in state.optimizer.state
                  for v in state.optimizer.state[p].values() if torch.is_tensor(v) and v.dim() > 0))


def worker(run: str, steps: int) -> None:
    """Runs under torchrun: `steps` + 1 training steps of run "shape/engine"; rank 0 prints one JSON line."""
    shape, engine = run.split("/")
    cfg = Config.from_flags(data="synthetic:200", synthetic_size="3-6", fsdp=engine == "fsdp", **SHAPES[shape])
    dist, device = init_distributed("cpu", cfg.optim.fsdp)
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, device, dist)
    state = training.build_train_state(cfg, device, dist)
    data.sampler.set_epoch(0)
    windows = epoch_windows(data.loader, steps + 1, 1, device)
    training.train_step(state, next(windows), cfg, dist)  # warm-up; AdamW's state exists from here
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for window in windows:
            training.train_step(state, window, cfg, dist)
    seconds = (time.perf_counter() - start) / steps
    calls = sum(e.count for e in prof.key_averages()  # gloo's or nccl's
                if ":" in e.key and any(c in e.key.split(":")[-1] for c in COLLECTIVES)) / steps
    if dist.is_main:
        print(json.dumps({"calls": calls, "step_s": seconds, "qwen_bytes": qwen_bytes(state),
                          "tensors": sum(len(g["params"]) for g in state.optimizer.param_groups)}))
    del state  # DDP's reducer goes before its process group
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--runs", default=RUNS, help="shape/engine pairs, shape one of: " + ", ".join(SHAPES))
    ap.add_argument("--worker", metavar="RUN", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    print(f"## two gloo processes, {args.steps} steps, {os.cpu_count()} CPU cores")
    print(f"{'shape':<12}{'engine':<8}{'tensors':>9}{'collectives/step':>18}{'step ms':>10}{'Qwen MiB/process':>18}")
    for run in args.runs.split(","):
        out = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "bench.grad_reduction", "--worker", run,
                              "--steps", str(args.steps)], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{run}: worker failed\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        shape, engine = run.split("/")
        print(f"{shape:<12}{engine:<8}{r['tensors']:>9}{r['calls']:>18.1f}{1e3 * r['step_s']:>10.0f}"
              f"{r['qwen_bytes'] / MiB:>18,.0f}", flush=True)


if __name__ == "__main__":
    main()
