"""Validation as ARC Prize scores it: attempts by augmentation voting, optional test-time training.

For each evaluation test input the model predicts under K reversible augmentations (the identity
first); every prediction is mapped back with the exact inverse and the distinct candidates are
ranked by votes, ties broken by mean log-probability; the top two are attempts 1 and 2.

With test-time training, before predicting a task the chosen parameters are trained for a few
steps on leave-one-out episodes made from that task's DEMOS only (augmented), then predicted with,
then restored bit for bit. A task's test outputs are never read before scoring.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from data.arc import ArcTask
from data.canvas import NUM_COLOURS, decode_prediction
from data.episodes import EpisodeDataset, collate, training_episodes
from engine.distributed import Dist
from engine.loop import to_device
from engine.precision import MixedPrecision
from engine.render import task_image
from engine.run_state import Parts
from engine.scoring import Candidates, pair_metrics, summarise
from loss_function import EFECoefs, efe_loss

TTT_PARAMS = ("all", "adapter", "prompt")
EVAL_AUG_BASE = 1_000_003  # ids of the evaluation views after the identity (fixed: every validation votes alike)


@dataclass(frozen=True)
class EvalCfg:
    augments: int = 1  # views voted over per test input
    batch_size: int = 32
    ttt_steps: int = 0
    ttt_lr: float = 1e-3
    ttt_params: str = "adapter"
    ttt_batch: int = 8
    amp: str = "off"
    clip: float = 1.0
    seed: int = 0
    images: int = 4  # tasks drawn as images (main process)


def view_ids(k: int) -> list[int]:
    return [0] + [EVAL_AUG_BASE + j for j in range(k - 1)]


def predict(parts: Parts, batch: dict, step: int) -> torch.Tensor:
    """Logits [B, S, S, 12] with the mean (deterministic) refinement."""
    prompt = parts.prompt(batch["demo_texts"], batch["numeric"], batch["relation"], step)
    return parts.agent(batch["input"], parts.policy.refine_mean(prompt, batch["ctrl"], batch["numeric"]))


@torch.no_grad()
def candidates(parts: Parts, dataset: EpisodeDataset, episodes: list[int], cfg: EvalCfg, step: int,
               device: torch.device) -> dict[int, Candidates]:
    items = [(e, a) for e in episodes for a in view_ids(cfg.augments)]
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=items, collate_fn=collate)
    out: dict[int, Candidates] = defaultdict(Candidates)
    with parts.amp.autocast():
        for batch in loader:
            batch = to_device(batch, device)
            logits = predict(parts, batch, step).float()
            colour_logp, colour = F.log_softmax(logits[..., :NUM_COLOURS], -1).max(-1)
            # one transfer per batch, then decoding on the CPU
            full, colour, colour_logp = (t.cpu().numpy() for t in (logits.argmax(-1), colour, colour_logp))
            for b, aug in enumerate(batch["augmentation"]):
                grid = decode_prediction(full[b], colour[b])
                logp = float(colour_logp[b, :grid.shape[0], :grid.shape[1]].mean())
                out[batch["episode"][b]].add(aug.invert_grid(grid), logp)
    return out


def ttt_parameters(parts: Parts, which: str) -> list[torch.nn.Parameter]:
    """all: prompt heads, refinement and agent; adapter: the agent's parameters that read the prompt
    outside its blocks (agent.adapter_parameters) and the refinement; prompt: prompt heads and
    refinement. Never the Qwen trunk."""
    refiner = list(parts.policy.refiner.parameters())
    if which == "prompt":
        return [*parts.prompt.head_parameters(), *refiner]
    if which == "adapter":
        return [*parts.agent.adapter_parameters(), *refiner]
    return [*parts.prompt.head_parameters(), *parts.agent.parameters(), *refiner]


@contextmanager
def adapted_to(parts: Parts, task: ArcTask, cfg: EvalCfg, eval_set: EpisodeDataset, coefs: EFECoefs,
               device: torch.device):
    """Train the chosen parameters on the task's demos; restore them exactly on exit."""
    episodes = training_episodes((ArcTask(task.task_id, task.train, ()),))  # demos only: no test pair
    if cfg.ttt_steps <= 0 or not episodes:
        yield
        return
    params = ttt_parameters(parts, cfg.ttt_params)
    chosen = {id(p) for p in params}
    every = [p for m in parts.modules().values() for p in m.parameters()]
    flags = [p.requires_grad for p in every]
    saved = [p.detach().clone() for p in params]
    for p in every:  # gradients reach the chosen parameters only; base gradients stay as they are
        p.requires_grad_(id(p) in chosen)
    optimizer = torch.optim.AdamW(params, lr=cfg.ttt_lr, weight_decay=0.0)
    amp = MixedPrecision(cfg.amp, device)
    dataset = EpisodeDataset(episodes, eval_set.scale, canvas=eval_set.canvas)  # demos: their outputs are known
    rng = np.random.default_rng([cfg.seed, zlib.crc32(task.task_id.encode())])
    try:
        for step in range(cfg.ttt_steps):
            picks = rng.integers(len(episodes), size=cfg.ttt_batch)
            batch = to_device(collate([dataset[(int(i), int(rng.integers(8, 2**31 - 1)))] for i in picks]), device)
            with amp.autocast():
                prompt = parts.prompt(batch["demo_texts"], batch["numeric"], batch["relation"], step)
                refined = parts.policy.refine_mean(prompt, batch["ctrl"], batch["numeric"])
                logits = parts.agent(batch["input"], refined)
                loss = efe_loss(logits, batch["target"], batch["input"], refined, prompt, coefs).per_sample.mean()
            amp.backward(loss)
            amp.step(optimizer, cfg.clip)
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None
        for p, flag in zip(every, flags):
            p.requires_grad_(flag)


def evaluate(parts: Parts, dataset: EpisodeDataset, cfg: EvalCfg, coefs: EFECoefs, step: int, device: torch.device,
             dist: Dist = Dist()) -> tuple[dict[str, float], dict[str, list[dict]], list[tuple[str, np.ndarray]]]:
    """Score every test input of the evaluation set (this process's share; records are gathered).

    -> (metrics `eval/*` incl. `eval/copy_*`, submission {task_id: [{"attempt_1", "attempt_2"}, ...]},
    images [(task_id, HWC uint8)] for the first `cfg.images` tasks, on the main process).
    """
    parts.train(False)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(dataset.episodes):
        by_task[ep.task.task_id].append(i)
    tasks = sorted(by_task)[dist.rank::dist.world_size]
    records, copy_records, attempts, seconds = [], [], {}, []
    for task_id in tasks:
        episodes = by_task[task_id]
        start = time.perf_counter()
        with adapted_to(parts, dataset.episodes[episodes[0]].task, cfg, dataset, coefs, device):
            cands = candidates(parts, dataset, episodes, cfg, step, device)
        seconds.append(time.perf_counter() - start)
        for i in episodes:
            ep = dataset.episodes[i]  # the scorer is the only reader of ep.query.output
            attempts[i] = cands[i].attempts()
            records.append((task_id, pair_metrics(attempts[i], ep.query.output, ep.query.input,
                                                  cands[i].contains(ep.query.output))))
            copy_records.append((task_id, pair_metrics((ep.query.input,) * 2, ep.query.output, ep.query.input)))
    parts.train(True)
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
    for task_id in sorted(by_task)[:cfg.images]:
        i = by_task[task_id][0]
        ep = dataset.episodes[i]
        images.append((task_id, task_image(ep.context, ep.query.input, ep.query.output, attempts[i])))
    return metrics, submission, images

