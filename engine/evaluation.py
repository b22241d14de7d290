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

from data.canvas import NUM_COLOURS, decode_prediction
from data.episodes import EpisodeDataset, collate
from engine.adaptation import adapted_to
from engine.config import Config
from engine.distributed import Dist
from engine.loop import to_device
from engine.precision import autocast
from engine.render import task_image
from engine.scoring import Candidates, pair_metrics, summarise
from model import ArcModel
from prompt import QwenFeatures, with_qwen_features

EVAL_AUG_BASE = 1_000_003  # ids of the evaluation views after the identity (fixed: every validation votes alike)
IMAGES = 4  # tasks drawn as images for TensorBoard


def view_ids(k: int) -> list[int]:
    return [0] + [EVAL_AUG_BASE + j for j in range(k - 1)]


@torch.no_grad()
def candidates(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, episodes: list[int], *,
               cfg: Config, device: torch.device) -> dict[int, Candidates]:
    """Predictions for `episodes` under every view, each mapped back to the original frame."""
    items = [(e, a) for e in episodes for a in view_ids(cfg.eval.eval_augments)]
    loader = DataLoader(dataset, batch_size=cfg.eval.eval_batch_size, sampler=items, collate_fn=collate)
    out: dict[int, Candidates] = defaultdict(Candidates)
    with autocast(cfg.optim.amp, device.type):
        for batch in loader:
            batch = with_qwen_features(to_device(batch, device), prompts, 0, training=False)
            logits = model(batch, cfg.eval.eval_refinement).logits[0].float()
            colour_logp, colour = F.log_softmax(logits[..., :NUM_COLOURS], -1).max(-1)
            # one transfer per batch, then decoding on the CPU
            full, colour, colour_logp = (t.cpu().numpy() for t in (logits.argmax(-1), colour, colour_logp))
            for b, aug in enumerate(batch["augmentation"]):
                grid = decode_prediction(full[b], colour[b])
                logp = float(colour_logp[b, :grid.shape[0], :grid.shape[1]].mean())
                out[batch["episode"][b]].add(aug.invert_grid(grid), logp)
    return out


@dataclass
class EvalResult:
    metrics: dict[str, float]  # eval/* incl. eval/copy_* and eval/seconds_per_task
    submission: dict[str, list[dict]]  # {task_id: [{"attempt_1": grid, "attempt_2": grid}, ...]}, test inputs in order
    images: list[tuple[str, np.ndarray]]  # (task_id, [H, W, 3] uint8) for the first IMAGES tasks


def evaluate(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, *, cfg: Config,
             device: torch.device, dist: Dist = Dist()) -> EvalResult:
    """Score every test input of the evaluation set (this process's share of the tasks; records are
    gathered, so every process returns the whole result)."""
    was_training = model.training
    model.train(False)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(dataset.episodes):
        by_task[ep.task.task_id].append(i)
    tasks = sorted(by_task)[dist.rank::dist.world_size]
    records, copy_records, attempts, seconds = [], [], {}, []
    for task_id in tasks:
        episodes = by_task[task_id]
        start = time.perf_counter()
        with adapted_to(model, prompts, dataset.episodes[episodes[0]].task, dataset, cfg=cfg, device=device):
            cands = candidates(model, prompts, dataset, episodes, cfg=cfg, device=device)
        seconds.append(time.perf_counter() - start)
        for i in episodes:
            ep = dataset.episodes[i]  # the scorer is the only reader of ep.query.output
            attempts[i] = cands[i].attempts()
            records.append((task_id, pair_metrics(attempts[i], ep.query.output, ep.query.input,
                                                  cands[i].contains(ep.query.output))))
            copy_records.append((task_id, pair_metrics((ep.query.input,) * 2, ep.query.output, ep.query.input)))
    model.train(was_training)
    gathered = dist.gather((records, copy_records, attempts, seconds))
    records = [r for g in gathered for r in g[0]]
    copy_records = [r for g in gathered for r in g[1]]
    attempts = {i: a for g in gathered for i, a in g[2].items()}
    metrics = {f"eval/{k}": v for k, v in summarise(records).items()}
    metrics.update({f"eval/copy_{k}": v for k, v in summarise(copy_records).items() if k != "oracle"})
    metrics["eval/seconds_per_task"] = float(np.mean([s for g in gathered for s in g[3]]))
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

