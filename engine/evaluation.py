"""Validation as ARC Prize scores it: attempts by augmentation voting, optional test-time training.

For each evaluation test input the model predicts under K reversible augmentations (the identity
first); every prediction is mapped back with the exact inverse and the distinct candidates are
ranked by votes, ties broken by mean log-probability; the top two are attempts 1 and 2.

With test-time training (engine/adaptation.py), each task is predicted by weights adapted to its
demos, restored bit for bit after. A task's test outputs are read by the scorer only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from data.augment import view_ids
from data.canvas import NUM_COLOURS, decode_prediction
from data.episodes import EpisodeDataset, collate
from engine.adaptation import AdaptedTasks, adapt_tasks, adapted_weights
from engine.config import Config
from engine.distributed import Dist
from engine.loop import to_device
from engine.precision import autocast
from engine.render import task_image
from engine.scoring import RANKINGS, Candidates, pair_metrics, summarise
from model import ArcModel
from prompt import QwenFeatures, with_qwen_features

IMAGES = 4  # tasks drawn as images for TensorBoard


@torch.no_grad()
def candidates(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, episodes: list[int], *,
               cfg: Config, device: torch.device, adapted: AdaptedTasks | None = None) -> dict[int, Candidates]:
    """Predictions for `episodes` under every view, each mapped back to the original frame (with the
    per-task adapter of `adapted`, when there is one)."""
    items = [(e, a) for e in episodes for a in view_ids(cfg.eval.eval_augments)]
    loader = DataLoader(dataset, batch_size=cfg.eval.eval_batch_size, sampler=items, collate_fn=collate)
    out: dict[int, Candidates] = defaultdict(Candidates)
    with autocast(cfg.optim.amp, device.type):
        for batch in loader:
            batch = with_qwen_features(to_device(batch, device), prompts, 0, training=False)
            adapter = None
            if adapted is not None and adapted.adapters is not None:
                adapter = adapted.adapters(torch.tensor([adapted.row[t] for t in batch["task_id"]], device=device))
            logits = model(batch, cfg.eval.eval_refinement, adapter).logits[0].float()
            logp = F.log_softmax(logits, -1)
            colour_logp, colour = F.log_softmax(logits[..., :NUM_COLOURS], -1).max(-1)
            # one transfer per batch, then decoding on the CPU
            full, colour, colour_logp, logp = (t.cpu().numpy() for t in (logits.argmax(-1), colour, colour_logp, logp))
            for b, aug in enumerate(batch["augmentation"]):
                grid = decode_prediction(full[b], colour[b])
                mean_logp = float(colour_logp[b, :grid.shape[0], :grid.shape[1]].mean())
                out[batch["episode"][b]].add(aug.invert_grid(grid), mean_logp, aug, logp[b])
    return out


@dataclass
class EvalResult:
    metrics: dict[str, float]  # eval/* incl. eval/copy_* and eval/seconds_per_task
    submission: dict[str, list[dict]]  # {task_id: [{"attempt_1": grid, "attempt_2": grid}, ...]}, test inputs in order
    images: list[tuple[str, np.ndarray]]  # (task_id, [H, W, 3] uint8) for the first IMAGES tasks


def task_groups(task_ids: list[str], by_task: dict[str, list[int]], dataset: EpisodeDataset,
                size: int) -> list[list[str]]:
    """Tasks adapted together: `size` at a time, alike in canvas side (a batch is cut to its largest)."""
    ordered = sorted(task_ids, key=lambda t: (max(dataset.sides[i] for i in by_task[t]), t))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def evaluate(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, *, cfg: Config,
             device: torch.device, dist: Dist = Dist()) -> EvalResult:
    """Score every test input of the evaluation set (this process's share of the tasks; records are
    gathered, so every process returns the whole result). Attempts are ranked by `--attempt_ranking`;
    `pass2_votes`, `pass2_logprob` and `pass2_hedged` report every ranking."""
    was_training = model.training
    model.train(False)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(dataset.episodes):
        by_task[ep.task.task_id].append(i)
    per_task_weights = cfg.eval.ttt_steps > 0 and cfg.eval.ttt_params != "task"  # one task at a time
    groups = task_groups(sorted(by_task)[dist.rank::dist.world_size], by_task, dataset,
                         1 if per_task_weights else cfg.eval.adapt_tasks)
    records, copy_records, attempts, seconds, ttt_steps = [], [], {}, [], []
    for group in groups:
        start = time.perf_counter()
        tasks = [dataset.episodes[by_task[t][0]].task for t in group]
        episodes = [i for t in group for i in by_task[t]]
        adapted = adapt_tasks(model, prompts, tasks, dataset, cfg=cfg, device=device)  # search (and task TTT)
        with adapted_weights(model, prompts, tasks[0], dataset, cfg=cfg, device=device, searched=adapted) as steps:
            cands = candidates(model, prompts, dataset, episodes, cfg=cfg, device=device, adapted=adapted)
        seconds += [(time.perf_counter() - start) / len(group)] * len(group)
        ttt_steps += [steps] * len(group)
        for i in episodes:
            ep = dataset.episodes[i]  # the scorer is the only reader of ep.query.output
            attempts[i] = cands[i].attempts(cfg.eval.attempt_ranking)
            metrics = pair_metrics(attempts[i], ep.query.output, ep.query.input, cands[i].contains(ep.query.output))
            for ranking in RANKINGS:
                metrics[f"pass2_{ranking}"] = pair_metrics(cands[i].attempts(ranking), ep.query.output,
                                                           ep.query.input)["pass2"]
            records.append((ep.task.task_id, metrics))
            copy_records.append((ep.task.task_id, pair_metrics((ep.query.input,) * 2, ep.query.output,
                                                                ep.query.input)))
    model.train(was_training)
    gathered = dist.gather((records, copy_records, attempts, seconds, ttt_steps))
    records = [r for g in gathered for r in g[0]]
    copy_records = [r for g in gathered for r in g[1]]
    attempts = {i: a for g in gathered for i, a in g[2].items()}
    metrics = {f"eval/{k}": v for k, v in summarise(records).items()}
    metrics.update({f"eval/copy_{k}": v for k, v in summarise(copy_records).items() if k != "oracle"})
    metrics["eval/seconds_per_task"] = float(np.mean([s for g in gathered for s in g[3]]))
    metrics["eval/tasks"] = float(len(by_task))
    if per_task_weights:
        metrics["eval/ttt_steps_per_task"] = float(np.mean([n for g in gathered for n in g[4]]))
    submission: dict[str, list[dict]] = {}
    for i in sorted(attempts, key=lambda i: (dataset.episodes[i].task.task_id, i)):
        a1, a2 = attempts[i]
        submission.setdefault(dataset.episodes[i].task.task_id, []).append(
            {"attempt_1": a1.tolist(), "attempt_2": a2.tolist()})
    images = []
    for task_id in sorted(by_task)[:IMAGES]:
        i = by_task[task_id][0]
        ep = dataset.episodes[i]
        images.append((task_id, task_image(ep.context, ep.query.input, ep.query.output, attempts[i])))
    return EvalResult(metrics, submission, images)
