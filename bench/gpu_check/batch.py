"""Micro-batches that fill the GPU: the one-GPU recipe (configs/gpu-1.toml, the Qwen2.5-0.5B shape
with random weights) with Qwen frozen, so a step reads every prompt from the cache and holds no Qwen
activations, on its largest canvas (`--canvas full`: 64 x 64 cells whatever the grids, the memory of
the worst batch), at micro-batch 8 and then doubled until one runs out of memory or the section's
time is spent. Each row: the warm step (`bench.step_profile`'s loop pass over the same windows, the
prompt cache warm), episodes a second, the loader's time and the step's peak memory. The largest that fits and the
fastest are what `--batch_size` x `--grad_accum` in configs/gpu-*.toml should be built from (a frozen
Qwen; the recipe's LoRA refresh steps hold Qwen's activations for every demo token, and 8 is what
fits them).

Not in the check's default sections (each row builds the recipe's data and trains a few steps):
`make gpu-check ARGS="--sections batch"`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import training
from bench.gpu_check.context import RECIPE, RECIPE_QWEN, TINY_RECIPE, Check
from bench.gpu_check.report import Section
from bench.step_profile import loop_pass
from engine.config import Config
from engine.run_logger import RunLogger
from training.cli import read_config_file


def ladder(first: int, most: int) -> list[int]:
    """first, 2 x first, ... up to `most`."""
    sizes = [first]
    while 2 * sizes[-1] <= most:
        sizes.append(2 * sizes[-1])
    return sizes


def recipe_flags(check: Check, size: int, windows: int) -> dict:
    """The recipe at micro-batch `size` with Qwen frozen, on its largest canvas, one micro-batch a
    step, the loader in this process (workers would hold batches of every size tried), on synthetic
    tasks enough for `windows` batches in one epoch (4 episodes a task; ARC-AGI-1's 1,600 episodes
    would give a batch of 1,024 one step an epoch): on the full canvas the canvas, not the grids,
    sets a step's time and memory."""
    return {**read_config_file(RECIPE), "data": f"synthetic:{-(-size * windows // 3)}", "qwen_model": RECIPE_QWEN,
            "qwen_train": "frozen", "canvas": "full", "batch_size": size, "grad_accum": 1, "num_workers": 0,
            "device": check.device.type, **(TINY_RECIPE if check.tiny else {})}


def run(check: Check, section: Section) -> None:
    steps, warmup = (2, 1) if check.tiny else (8, 2)
    sizes = ladder(2, 8) if check.tiny else ladder(8, 4096)
    flags = recipe_flags(check, sizes[0], steps + warmup)
    section.notes.append(f"{RECIPE} with --qwen_train frozen --canvas full (side 30), "
                         f"--qwen_model {flags['qwen_model']}, --amp {flags['amp']}, synthetic tasks; {steps} warm "
                         f"steps after {warmup}, medians; episodes a second from the step alone (the recipe's "
                         f"loader workers prepare batches beside it), the loader's own time in this process beside")
    fits = []
    with tempfile.TemporaryDirectory() as logs:
        for (size,) in check.budgeted(section, [(s,) for s in sizes]):
            cfg = Config.from_flags(**recipe_flags(check, size, steps + warmup))
            try:
                row = measure(check, cfg, steps, warmup, Path(logs) / str(size))
            except torch.OutOfMemoryError:
                section.rows.append({"micro-batch": size, "fits": "no: out of memory"})
                break
            finally:
                if check.device.type == "cuda":
                    torch.cuda.empty_cache()
            section.rows.append({"micro-batch": size, "fits": "yes", **row})
            fits.append((row["episodes/s"], size))
    if fits:
        best = max(fits)
        section.notes.append(f"largest that fits: {fits[-1][1]}; fastest: {best[1]} ({best[0]:.0f} episodes a second)")


def measure(check: Check, cfg: Config, steps: int, warmup: int, log_dir: Path) -> dict:
    """A fresh state and loader at the config's batch, a cold pass (the prompt cache fills) and a warm
    one over the same windows. -> the row: warm step ms, episodes a second, peak GiB."""
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, check.device)
    state = training.build_train_state(cfg, check.device, tasks=len(data.task_ids))  # --task_embedding's rows
    logger = RunLogger(log_dir, cfg.flags(), "bench")
    try:
        loop_pass(state, data, cfg, logger, warmup=warmup, steps=steps, device=check.device)
        check.reset_peak_memory()
        warm = loop_pass(state, data, cfg, logger, warmup=warmup, steps=steps, device=check.device)
    finally:
        logger.close()
    peak = check.peak_memory_gib()
    return {"step ms": round(1e3 * warm["train_step"], 1), "loader ms": round(1e3 * warm["data"], 1),
            "episodes/s": round(cfg.data.batch_size / warm["train_step"], 1),
            "peak GiB": round(peak, 1) if peak is not None else "n/a"}
