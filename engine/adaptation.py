"""Per-task adaptation before a task is predicted: test-time training on the task's own demos.

The chosen parameters (ArcModel.ttt_parameters) are trained for `--ttt_steps` steps on augmented
leave-one-out episodes made from the task's DEMOS only, then the task is predicted, then every
parameter is restored bit for bit. A task's test outputs are never read.
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager

import numpy as np
import torch

from data.arc import ArcTask
from data.episodes import EpisodeDataset, collate, training_episodes
from engine.config import Config
from engine.loop import to_device
from engine.precision import MixedPrecision
from loss_function import efe_loss
from model import ArcModel
from prompt import QwenFeatures, with_qwen_features


@contextmanager
def adapted_to(model: ArcModel, prompts: QwenFeatures | None, task: ArcTask, eval_set: EpisodeDataset, *,
               cfg: Config, device: torch.device):
    """Train the chosen parameters on the task's demos; restore them exactly on exit."""
    episodes = training_episodes((ArcTask(task.task_id, task.train, ()),))  # demos only: no test pair
    steps = cfg.eval.ttt_steps
    if steps <= 0 or not episodes:
        yield
        return
    params = model.ttt_parameters(cfg.eval.ttt_params)
    chosen = {id(p) for p in params}
    every = list(model.parameters())
    flags = [p.requires_grad for p in every]
    saved = [p.detach().clone() for p in params]
    for p in every:  # gradients reach the chosen parameters only
        p.requires_grad_(id(p) in chosen)
    optimizer = torch.optim.AdamW(params, lr=cfg.eval.ttt_lr, weight_decay=0.0)
    amp = MixedPrecision(cfg.optim.amp, device)
    dataset = EpisodeDataset(episodes, eval_set.scale, canvas=eval_set.canvas)  # demos: their outputs are known
    rng = np.random.default_rng([cfg.run.seed, zlib.crc32(task.task_id.encode())])
    try:
        for _ in range(steps):
            picks = rng.integers(len(episodes), size=cfg.eval.ttt_batch_size)
            batch = to_device(collate([dataset[(int(i), int(rng.integers(8, 2**31 - 1)))] for i in picks]), device)
            batch = with_qwen_features(batch, prompts, 0, training=False)
            with amp.autocast():
                pred = model(batch, "mean")
                loss = efe_loss(pred.logits[0], batch["target"], batch["input"], pred.refined[0], pred.prompt,
                                cfg=cfg.loss).per_sample.mean()
            amp.backward(loss)
            amp.step(optimizer, cfg.optim.clip)
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None
        for p, flag in zip(every, flags):
            p.requires_grad_(flag)
