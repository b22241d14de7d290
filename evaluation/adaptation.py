"""Per-task adaptation before a task is predicted: the demos decide.

Every method trains on augmented leave-one-out episodes of a task's DEMOS only (one demo is the
query, the others the context, under the fixed evaluation views); a task's test outputs are never
read. The shared weights end exactly as they started.

- Latent search (`--latent_steps`, `--latent_lr`, `--latent_starts K`): each task gets K latents,
  added to the refined prompt: the mean refinement (0) and K-1 draws of the RL head's Gaussian. Adam
  moves them on the demos' loss, weights frozen; the start with the lowest demo loss is kept.
- View starts (`--view_starts`): a start per input view, the view gate forced towards it; only
  the views that give every demo output its shape are tried.
- Test-time training (`--ttt_steps`, `--ttt_lr`, `--ttt_schedule`, `--ttt_params`), after the search:
  `task`: a per-task adapter (agents/adapter.py: latent, view-gate bias, class-map bias, a rank
  `--ttt_rank` update of the cell states after every block) trained from the kept start;
  `all` / `late` / `adapter` / `prompt`: named groups of the shared weights (ArcModel.ttt_parameters),
  trained one task at a time under the kept start and restored bit for bit after; a task stops
  early once every demo episode is exact under `--ttt_stop_views` views (checked every
  `--ttt_check_every` steps), so steps go to the tasks whose demos are not yet solved.
- Both per-task states batch over tasks: `--adapt_tasks` tasks (x K starts) share every step, each
  sample reading its own task's rows, so a GPU adapts hundreds of tasks at once and a CPU pays no
  per-task overhead.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from agents.adapter import AdapterSlice, TaskAdapters
from agents.views import views_fitting
from data.arc import ArcTask
from data.augment import view_ids
from data.episodes import EpisodeDataset, collate, training_episodes
from engine.config import Config
from engine.loop import to_device
from engine.precision import MixedPrecision
from engine.schedule import lr_factor, set_lrs
from loss_function import efe_loss
from model import ArcModel
from prompt import QwenFeatures

# A view start's gate bias: that view all but alone. A trained gate's own logits span ~15 (+10 on
# the views its training used, -5 on the others: measured after a 5-minute run on the unseen
# families), so a bias of 10 left a flip start 13-89% of the mix and the agent read a blend.
VIEW_START_LOGIT = 30.0


@dataclass
class AdaptedTasks:
    """What prediction needs: the per-task adapter (None when nothing adapted it) and each task's row."""

    adapters: TaskAdapters | None
    row: dict[str, int]  # task id -> its row of `adapters`
    demo_loss: dict[str, float]  # task id -> the demos' loss with the kept state (nan when not adapted)


class DemoEpisodes:
    """Augmented leave-one-out episodes of several tasks' demos; each sample is computed once (the
    pool is finite: episodes x `views`)."""

    def __init__(self, tasks: list[ArcTask], eval_set: EpisodeDataset, seed: int, views: int):
        self.episodes = [training_episodes((ArcTask(t.task_id, t.train, ()),)) for t in tasks]  # demos only
        flat = [ep for eps in self.episodes for ep in eps]
        # demo outputs are known; the task embedding rows are the evaluation set's
        self.dataset = EpisodeDataset(flat, eval_set.scale, canvas=eval_set.canvas, task_rows=eval_set.task_rows,
                                      context_demos=eval_set.context_demos)
        self.first = np.cumsum([0] + [len(e) for e in self.episodes])[:-1]
        self.views = view_ids(views)
        self.rng = np.random.default_rng([seed, zlib.crc32("|".join(t.task_id for t in tasks).encode())])
        self.samples: dict[tuple[int, int], dict] = {}

    def sample(self, index: int, aug: int) -> dict:
        if (index, aug) not in self.samples:
            self.samples[(index, aug)] = self.dataset[(index, aug)]
        return self.samples[(index, aug)]

    def draw(self, rows: dict[int, int], per_row: int) -> tuple[dict, torch.Tensor]:
        """`per_row` random augmented episodes for every adapter row ({row: its task}).
        -> (collated batch, the row of each sample [B] int64)."""
        samples, of = [], []
        for row, task in rows.items():
            for _ in range(per_row):
                i = self.first[task] + int(self.rng.integers(len(self.episodes[task])))
                samples.append(self.sample(int(i), self.views[int(self.rng.integers(len(self.views)))]))
                of.append(row)
        return collate(samples), torch.tensor(of)

    def every(self, rows: dict[int, int], views: int = 1) -> tuple[dict, torch.Tensor]:
        """Every leave-one-out episode of each row's task under the first `views` views (1: unaugmented,
        the demo loss that picks a start)."""
        samples, of = [], []
        for row, task in rows.items():
            for j in range(len(self.episodes[task])):
                for aug in self.views[:views]:
                    samples.append(self.sample(int(self.first[task] + j), aug))
                    of.append(row)
        return collate(samples), torch.tensor(of)


def _set_step_lr(optimizer: torch.optim.Optimizer, base: list[float], step: int, steps: int, schedule: str) -> None:
    """Every group's lr for this step: its base lr (`base`, in group order) under the schedule."""
    set_lrs(optimizer, base, lr_factor(schedule, step / steps))


def _row_losses(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters, batch: dict,
                rows: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Mean EFE over each adapter row's samples -> [rows of the adapter] float32 (0 for a row without)."""
    pred = model(model.encode_prompts(batch, prompts, 0, training=False), "mean", adapters(rows))
    per_sample = efe_loss(pred.logits[0], batch["target"], batch["input"], pred.refined[0], pred.prompt,
                          cfg=cfg.loss).per_sample
    n = adapters.latent.shape[0]
    total = torch.zeros(n, device=per_sample.device).index_add(0, rows, per_sample)
    count = torch.zeros(n, device=per_sample.device).index_add(0, rows, torch.ones_like(per_sample))
    return total / count.clamp_min(1)


def _train(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters, groups: list[dict],
           demos: DemoEpisodes, rows: dict[int, int], *, steps: int, schedule: str, cfg: Config,
           device: torch.device, stop: Callable[[], bool]) -> None:
    """Adam on parameter groups of the adapter, each group's lr under `schedule`. The loss is the sum
    over rows of each row's mean, so every row moves as if it were trained alone (Adam works per element).
    Ends early when `stop()` says so."""
    optimizer = torch.optim.Adam(groups, fused=True)
    base = [g["lr"] for g in optimizer.param_groups]
    amp = MixedPrecision(cfg.optim.amp, device)
    for step in range(steps):
        if stop():
            return
        _set_step_lr(optimizer, base, step, steps, schedule)
        batch, of = demos.draw(rows, cfg.eval.ttt_batch_size)
        with amp.autocast():
            loss = _row_losses(model, prompts, adapters, to_device(batch, device), of.to(device), cfg).sum()
        amp.backward(loss)
        amp.step(optimizer, clip=0.0)


@torch.no_grad()
def _demo_losses(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters, demos: DemoEpisodes,
                 rows: dict[int, int], cfg: Config, device: torch.device) -> torch.Tensor:
    batch, of = demos.every(rows)
    with MixedPrecision(cfg.optim.amp, device).autocast():
        return _row_losses(model, prompts, adapters, to_device(batch, device), of.to(device), cfg).float().cpu()


@contextmanager
def frozen(model: ArcModel):
    """No gradient for any shared weight: adaptation computes none and changes none."""
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def _starts(model: ArcModel, adapters: TaskAdapters, usable: list[int], per_task: int, cfg: Config) -> None:
    """Initialise each task's start rows: the mean refinement, `--latent_starts` - 1 RL-head draws,
    then (with `--view_starts`) one row per view with the gate forced towards that view."""
    generator = torch.Generator().manual_seed(cfg.run.seed)
    with torch.no_grad():
        for task in usable:
            first = task * per_task
            draws = model.draw_deltas(cfg.eval.latent_starts - 1, generator)
            adapters.latent[first + 1:first + cfg.eval.latent_starts] = draws.to(adapters.latent.device)
            for v in range(model.num_views if cfg.eval.view_starts else 0):
                adapters.gate_bias[first + cfg.eval.latent_starts + v, v] = VIEW_START_LOGIT


def adapt_tasks(model: ArcModel, prompts: QwenFeatures | None, tasks: list[ArcTask], eval_set: EpisodeDataset, *,
                cfg: Config, device: torch.device, stop: Callable[[], bool] = lambda: False) -> AdaptedTasks:
    """Search (starts, latent steps), keep each task's best start, then train its adapter
    (`--ttt_params task`); all of `tasks` together. Training ends early when `stop()` says so (the
    caller then discards the result)."""
    e = cfg.eval
    views = model.num_views if e.view_starts else 0
    per_task = e.latent_starts + views
    tune = e.ttt_steps > 0 and e.ttt_params == "task"
    unadapted = AdaptedTasks(None, {t.task_id: i for i, t in enumerate(tasks)},
                             {t.task_id: float("nan") for t in tasks})
    if not (per_task > 1 or e.latent_steps or tune):
        return unadapted
    demos = DemoEpisodes(tasks, eval_set, cfg.run.seed, cfg.eval.ttt_views)
    usable = [i for i, eps in enumerate(demos.episodes) if eps]  # a task with one demo has no episode
    if not usable:
        return unadapted
    adapters = model.task_adapters(len(tasks) * per_task, rank=e.ttt_rank, seed=cfg.run.seed)
    rows = {}  # row -> task: every latent start, and the view starts whose views size the task's demos right
    for task in usable:
        fits = [True] * e.latent_starts + (views_fitting(tasks[task].train) if views else [])
        rows.update({task * per_task + k: task for k in range(per_task) if fits[k]})
    with frozen(model):
        _starts(model, adapters, usable, per_task, cfg)
        if e.latent_steps:
            _train(model, prompts, adapters, [{"params": [adapters.latent], "lr": e.latent_lr}], demos, rows,
                   steps=e.latent_steps, schedule="constant", cfg=cfg, device=device, stop=stop)
        loss = _demo_losses(model, prompts, adapters, demos, rows, cfg, device)
        best = {task: min((r for r in rows if rows[r] == task), key=lambda r: float(loss[r])) for task in usable}
        if per_task > 1:  # one row per task from here on: its best start
            kept = model.task_adapters(len(tasks), rank=e.ttt_rank, seed=cfg.run.seed)
            with torch.no_grad():
                for name in ("latent", "gate_bias"):
                    getattr(kept, name)[list(best)] = getattr(adapters, name)[list(best.values())]
            adapters, loss = kept, loss[[best.get(t, 0) for t in range(len(tasks))]]
        rows = {task: task for task in usable}
        if tune:
            _train(model, prompts, adapters, adapters.param_groups(lr=e.ttt_lr, bias_lr=e.ttt_bias_lr,
                                                                   latent_lr=e.latent_lr),
                   demos, rows, steps=e.ttt_steps, schedule=e.ttt_schedule, cfg=cfg, device=device, stop=stop)
            loss = _demo_losses(model, prompts, adapters, demos, rows, cfg, device)
    return AdaptedTasks(adapters, {t.task_id: i for i, t in enumerate(tasks)},
                        {t.task_id: float(loss[i]) if i in rows else float("nan") for i, t in enumerate(tasks)})


@torch.no_grad()
def _solves_demos(model: ArcModel, prompts: QwenFeatures | None, demos: DemoEpisodes, kept, cfg: Config,
                  device: torch.device) -> bool:
    """Whether the model (under the kept start `kept`, an AdapterSlice of one row, or None) predicts
    every cell of each leave-one-out demo episode of the task exactly, under `--ttt_stop_views` views.
    The identity view is tried alone first: most checks fail there, at an eighth of the cost."""
    for views in sorted({1, cfg.eval.ttt_stop_views}):
        batch, _ = demos.every({0: 0}, views)
        batch = model.encode_prompts(to_device(batch, device), prompts, 0, training=False)
        with MixedPrecision(cfg.optim.amp, device).autocast():
            pred = model(batch, "mean", None if kept is None else kept.repeat(batch["input"].shape[0]))
        if not bool((pred.logits[0].argmax(-1) == batch["target"]).all()):
            return False
    return True


@contextmanager
def adapted_weights(model: ArcModel, prompts: QwenFeatures | None, task: ArcTask, eval_set: EpisodeDataset, *,
                    cfg: Config, device: torch.device, searched: AdaptedTasks | None = None,
                    observe: Callable[[int, AdapterSlice | None], None] | None = None,
                    stop: Callable[[], bool] = lambda: False):
    """`--ttt_params all|late|adapter|prompt`: train named groups of the shared weights on one task's
    demos, under the start the search kept for it (`searched`, frozen); restore them exactly on exit.
    Yields the steps taken: `--ttt_steps`, fewer when `--ttt_check_every` finds the demos solved (a
    task the search already solves takes none). `observe(steps, kept start)`, when given, is called
    before the first step and after every step (bench/ttt_curve.py measures the weights there).
    Training ends early when `stop()` says so (the caller then discards the task)."""
    demos = None  # built only when something trains: this runs for every task group of every validation
    if cfg.eval.ttt_steps > 0 and cfg.eval.ttt_params != "task":
        demos = DemoEpisodes([task], eval_set, cfg.run.seed, cfg.eval.ttt_views)
    if demos is None or not demos.episodes[0]:
        yield 0
        return
    kept = None
    if searched is not None and searched.adapters is not None:
        kept = searched.adapters(torch.tensor([searched.row[task.task_id]], device=device)).detach()
    check = cfg.eval.ttt_check_every
    params = model.ttt_parameters(cfg.eval.ttt_params)
    chosen = {id(p) for p in params}
    every = list(model.parameters())
    flags = [p.requires_grad for p in every]
    saved = [p.detach().clone() for p in params]
    for p in every:  # gradients reach the chosen parameters only
        p.requires_grad_(id(p) in chosen)
    optimizer = torch.optim.AdamW(params, lr=cfg.eval.ttt_lr, weight_decay=0.0, fused=True)
    base = [cfg.eval.ttt_lr]
    amp = MixedPrecision(cfg.optim.amp, device)
    try:
        steps = 0
        if observe is not None:
            observe(steps, kept)
        while steps < cfg.eval.ttt_steps and not stop() and not (
                check and steps % check == 0 and _solves_demos(model, prompts, demos, kept, cfg, device)):
            _set_step_lr(optimizer, base, steps, cfg.eval.ttt_steps, cfg.eval.ttt_schedule)
            steps += 1
            batch, _ = demos.draw({0: 0}, cfg.eval.ttt_batch_size)
            batch = model.encode_prompts(to_device(batch, device), prompts, 0, training=False)
            with amp.autocast():
                pred = model(batch, "mean", None if kept is None else kept.repeat(batch["input"].shape[0]))
                loss = efe_loss(pred.logits[0], batch["target"], batch["input"], pred.refined[0], pred.prompt,
                                cfg=cfg.loss).per_sample.mean()
            amp.backward(loss)
            amp.step(optimizer, cfg.optim.clip)
            if observe is not None:
                observe(steps, kept)
        yield steps
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None
        for p, flag in zip(every, flags):
            p.requires_grad_(flag)
