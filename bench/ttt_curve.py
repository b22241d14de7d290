"""What test-time training fits and what it generalizes, step by step, on a trained run.

    python -m bench.ttt_curve RUN [--tasks 30] [--marks 0,10,20,40,60,100,150] [--set ttt_lr=3e-3 ...]
                                  [--device cuda] [--json rows.json]

For each of the first `--tasks` evaluation tasks of the run (its own data flags, from the
checkpoint), the run's start (the mean refinement, or the search's kept start where the run has
`--view_starts`), then test-time training runs
`max(--marks)` steps with no early stop. At every mark the adapting model predicts, under the
identity view alone (argmax, no voting), every leave-one-out demo episode (what TTT trains on) and
every test input (what it is scored on; the test outputs are read here only, to score). The table averages over pairs:

    cell     share of the target's cells right (0 when the shape is wrong)
    changed  the same over the cells where the target differs from the input: the rule's part
    exact    whole grid right

Demo columns rising while test columns stay flat is memorisation: the steps past that point buy
nothing on the test inputs. The scores of `make bench-frontier` vote over views; these do not, so
compare rows within this table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import training
from bench.learnability import CPU, parse_settings
from data.canvas import decode_logits
from data.demo_episodes import DemoEpisodes
from data.episodes import EpisodeDataset, collate
from engine.checkpoint import find_checkpoint, load_state
from engine.config import Config
from engine.errors import ConfigError
from engine.loop import to_device
from engine.precision import autocast
from evaluation.adaptation import AdaptedTasks, adapted
from evaluation.evaluate import first_tasks
from evaluation.scoring import pair_metrics
from model import ArcModel
from prompt import QwenFeatures

COLUMNS = ("cell_acc", "changed_cell_acc", "exact")


@torch.no_grad()
def identity_scores(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, episodes: list[int],
                    adaptation: AdaptedTasks, cfg: Config, device: torch.device) -> list[dict[str, float]]:
    """pair_metrics of each episode's identity-view prediction (argmax, each task under its adapted
    rows) against its query output."""
    batch = model.encode_prompts(to_device(collate([dataset[(i, 0)] for i in episodes]), device), prompts, 0,
                               training=False)
    with autocast(cfg.optim.amp, device.type):
        logits = model(batch, "mean", adaptation.rows_of(batch, device)).of("mean")[0]
    out = []
    for b, i in enumerate(episodes):
        grid, query = decode_logits(logits[b].float()), dataset.episodes[i].query
        out.append(pair_metrics((grid, grid), query.output, query.input))
    return out


def curve(run: str, tasks: int, marks: list[int], settings: dict,
          device: torch.device = CPU) -> dict[int, dict[str, np.ndarray]]:
    """{mark: {"demo_<column>" / "test_<column>": per-pair values}} over the first `tasks` tasks."""
    folder = find_checkpoint(run)
    saved = load_state(folder)
    cfg = Config.from_saved(saved["config"]).replace(**{"eval_tasks": tasks, **settings, "ttt_steps": max(marks),
                                                        "ttt_small_steps": 0})
    data, state = training.load_run(cfg, folder, device, cache_dir=training.prompt_cache_dir(cfg, folder.parent.parent))
    evals = data.eval_set
    model = state.model.train(False)
    chosen = set(first_tasks(evals, tasks))  # the evaluation set holds every evaluation task
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(evals.episodes):
        if ep.task.task_id in chosen:
            by_task[ep.task.task_id].append(i)
    table: dict[int, dict[str, list[float]]] = {m: defaultdict(list) for m in marks}

    for task_id in sorted(by_task):
        task = evals.episodes[by_task[task_id][0]].task
        demos = DemoEpisodes([task], evals, cfg.run.seed, views=1)
        if not demos.episodes[0]:  # one demo: nothing to train on
            continue

        sets = (("demo", demos.dataset, list(range(len(demos.dataset)))), ("test", evals, by_task[task_id]))

        def observe(steps: int, adaptation: AdaptedTasks, sets=sets) -> None:  # this task's sets, bound here
            if steps not in table:
                return
            for where, dataset, episodes in sets:
                for scores in identity_scores(model, state.prompts, dataset, episodes, adaptation, cfg, device):
                    for column in COLUMNS:
                        table[steps][f"{where}_{column}"].append(scores[column])

        with adapted(model, state.prompts, [task], evals, cfg=cfg, device=device, observe=observe):
            pass
    return {m: {k: np.asarray(v) for k, v in cols.items()} for m, cols in table.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run folder or one of its checkpoints")
    ap.add_argument("--tasks", type=int, default=30, help="the first N evaluation tasks")
    ap.add_argument("--marks", default="0,10,20,40,60,100,150", help="steps at which to measure")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a fixed.py setting (ttt_lr, ttt_views, amp, ...) over the run's own")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--json", help="also write the table here: one row per mark")
    args = ap.parse_args()
    marks = sorted({int(m) for m in args.marks.split(",")})
    if marks[0] < 0 or marks[-1] == 0:
        raise SystemExit(f"--marks {args.marks}: steps must be >= 0, and one of them > 0")
    started = time.perf_counter()
    try:
        table = curve(args.run, args.tasks, marks, parse_settings(args.set), torch.device(args.device))
    except ConfigError as err:  # a bad run folder or setting: one line, not a traceback
        raise SystemExit(f"bench.ttt_curve {args.run}: {err}") from None
    pairs = (len(table[marks[0]]["demo_exact"]), len(table[marks[0]]["test_exact"]))
    print(f"## test-time training, step by step: {args.run}, first {args.tasks} evaluation tasks "
          f"({pairs[0]} demo episodes, {pairs[1]} test pairs), identity view, {time.perf_counter() - started:.0f} s")
    print(f"{'step':>6}" + "".join(f"{w + ' ' + c.split('_')[0]:>14}" for w in ("demo", "test") for c in COLUMNS))
    rows = [{"step": m, **{f"{w}_{c}": round(float(table[m][f"{w}_{c}"].mean()), 4) for w in ("demo", "test")
                           for c in COLUMNS}} for m in marks]
    for row in rows:
        print(f"{row['step']:>6}" + "".join(f"{v:>14.3f}" for k, v in row.items() if k != "step"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
