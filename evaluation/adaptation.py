"""Per-task adaptation before a task is predicted: the demos decide.

The search over starts and test-time training (docs/adaptation.md, "The methods") read a task's
demos only, never its test outputs, and leave the shared weights exactly as they started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from data.arc import ArcTask
from data.augment import view_ids
from data.demo_episodes import DemoEpisodes
from data.episodes import EpisodeDataset
from engine.config import Config
from engine.loop import host_to_device, to_device
from engine.precision import MixedPrecision
from engine.schedule import set_lrs
from evaluation.task_batch import TaskWeights, batches_shared_weights, fit_together
from evaluation.ttt_dropout import DropoutMasks, dropped_changes
from evaluation.ttt_policy import TTTPolicy
from loss_function import adaptation_loss
from model import AdapterSlice, ArcModel, TaskAdapters
from prompt import QwenFeatures

# A view start's gate bias: that view all but alone. A trained gate's own logits span ~15 (+10 on
# the views its training used, -5 on the others: measured after a 5-minute run on the unseen
# families), so a bias of 10 left a flip start 13-89% of the mix and the agent read a blend.
VIEW_START_LOGIT = 30.0


@dataclass
class AdaptedTasks:
    """What prediction needs: the per-task adapter (None when nothing adapted it) and each task's
    row of it; and what adapting found and took."""

    adapters: TaskAdapters | None
    row: dict[str, int]  # task id -> its row of `adapters` (and of `weights`)
    demo_loss: dict[str, float]  # task id -> the demos' loss as adapted (nan when not adapted)
    steps: dict[str, int]  # task id -> the test-time-training steps applied to it
    # tasks whose shared weights were adapted together: each one's copy (None: the model holds the
    # adapted weights of the group's one task, or none were adapted)
    weights: TaskWeights | None = None

    def load(self, task_id: str) -> None:
        """Before predicting a task adapted together with others: its copy of the weights into the model."""
        if self.weights is not None:
            self.weights.load(self.row[task_id])

    def rows_of(self, batch: dict, device: torch.device) -> AdapterSlice | None:
        """The adapter rows of a collated batch's samples (each its task's row, and with rows per view
        its augmentation's); None without an adapter."""
        if self.adapters is None:
            return None
        return self.adapters(torch.tensor([self.row[t] for t in batch["task_id"]], device=device), aug_ids(batch))


def aug_ids(batch: dict) -> list[int]:
    """The augmentation id of each sample of a collated batch."""
    return [a.aug_id for a in batch["augmentation"]]


def _row_losses(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters | None, batch: dict,
                of: torch.Tensor, slots: int, cfg: Config, amp: MixedPrecision) -> torch.Tensor:
    """Mean adaptation loss over each row's samples -> [slots] float32 (0 for a row without samples):
    the model on demo episodes (a collated batch on the model's device) with the mean refinement under
    --amp's autocast, each sample reading its adapter row (`of` [B] int64), or when `adapters` is None
    counting its loss to row `of`."""
    batch = model.encode_prompts(batch, prompts, 0, training=False)
    with amp.autocast():
        pred = model(batch, "mean", None if adapters is None else adapters(of, aug_ids(batch)))
    logits, refined = pred.of("mean")
    per_sample = adaptation_loss(logits, refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    total = torch.zeros(slots, device=per_sample.device).index_add(0, of, per_sample)
    count = torch.zeros(slots, device=per_sample.device).index_add(0, of, torch.ones_like(per_sample))
    return total / count.clamp_min(1)


@torch.no_grad()
def _demo_losses(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters | None, demos: DemoEpisodes,
                 rows: dict[int, int], slots: int, cfg: Config, device: torch.device,
                 amp: MixedPrecision) -> torch.Tensor:
    """Each row's loss on every demo episode of its task, unaugmented -> [slots] float32 on the CPU."""
    batch, of = demos.every(rows)
    return _row_losses(model, prompts, adapters, to_device(batch, device), host_to_device(of, device), slots, cfg,
                       amp).float().cpu()


def _fit(model: ArcModel, prompts: QwenFeatures | None, adapters: TaskAdapters | None, groups: list[dict],
         demos: DemoEpisodes, rows: dict[int, int], policy: TTTPolicy, *, cfg: Config, device: torch.device,
         amp: MixedPrecision, dropout: float = 0.0, observe: Callable[[int], None] = lambda steps: None) -> int:
    """One task's adaptation loop (docs/adaptation.md, "The methods", 2): Adam on `groups` (parameters of
    the model or of `adapters`, each group's base lr; gradients reach nothing else) under `policy`
    (evaluation/ttt_policy.py), `dropout` and `amp`, on `--ttt_batch_size` demo episodes per row ({adapter
    row: its task}) a step. The loss sums each row's mean, so every row moves as if trained alone (Adam
    works per element; the clip is the global norm's). `observe(steps tried)`: before the first step and
    after each. -> the steps taken: those applied, a step the scaler skipped not counted."""
    chosen = {id(p) for group in groups for p in group["params"]}
    for p in [*model.parameters(), *(adapters.parameters() if adapters is not None else ())]:
        p.requires_grad_(id(p) in chosen)
    optimizer = torch.optim.Adam(groups, fused=True)
    base = [g["lr"] for g in optimizer.param_groups]
    slots = max(rows) + 1
    tried = taken = 0
    observe(tried)
    masks = DropoutMasks(dropout, demos.seed, device) if dropout else None
    while policy.goes_on(tried):
        set_lrs(optimizer, base, policy.lr_factor(tried))
        tried += 1
        batch, of = demos.draw(rows, cfg.eval.ttt_batch_size)
        with dropped_changes(model, masks.draw if masks is not None else None):
            loss = _row_losses(model, prompts, adapters, to_device(batch, device), host_to_device(of, device), slots,
                               cfg, amp).sum()
        amp.backward(loss)
        result = amp.step(optimizer, policy.clip)
        taken += result is not None and result.stepped
        observe(tried)
        if result is not None and not result.stepped and not amp.scales_loss:
            break  # a gradient that is not finite, not the fp16 scaler's search: the policy ends the task here
    return taken


@contextmanager
def _shared_weights_kept(model: ArcModel, trained: list[nn.Parameter]) -> Iterator[None]:
    """On exit every shared weight in `trained` holds its value again (bit for bit, no gradient
    left), and every parameter of the model its requires_grad flag."""
    flags = [p.requires_grad for p in model.parameters()]
    saved = [p.detach().clone() for p in trained]
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(trained, saved, strict=True):
                p.copy_(s)
                p.grad = None
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)


def _starts(model: ArcModel, adapters: TaskAdapters, usable: list[int], per_task: int) -> None:
    """Initialise each task's start rows: the mean refinement (a row left at zero), then one row per
    view with the gate forced towards that view."""
    with torch.no_grad():
        for task in usable:
            for v in range(model.num_views):
                adapters.gate_bias[task * per_task + 1 + v, v] = VIEW_START_LOGIT


def searches(cfg: Config) -> bool:
    """Whether adaptation searches over starts: `--view_starts` and input views to start from (an agent
    builds its views exactly when --input_views)."""
    return cfg.eval.view_starts and cfg.agent.input_views


def _searches(model: ArcModel, cfg: Config) -> bool:
    """`searches`, and the model built has the views."""
    return searches(cfg) and model.num_views > 0


def _search(model: ArcModel, prompts: QwenFeatures | None, tasks: list[ArcTask], demos: DemoEpisodes,
            usable: list[int], *, cfg: Config, device: torch.device,
            amp: MixedPrecision) -> tuple[TaskAdapters | None, torch.Tensor | None]:
    """The view-start search: each task's starts, the mean refinement and one row per view that sizes
    every demo right with the gate forced towards that view, and the start with the lowest demo loss
    kept. -> (an adapter with one row per task holding its kept start, each task's demo loss there
    [len(tasks)] float32 (0 for a task not usable)); (None, None) when there is nothing to search."""
    if not _searches(model, cfg):
        return None, None
    per_task = 1 + model.num_views
    adapters = model.task_adapters(len(tasks) * per_task)
    rows = {}  # row -> task: the mean's start, and the view starts whose views size the task's demos right
    for task in usable:
        fits = [True, *model.views_fitting(tasks[task].train)]
        rows.update({task * per_task + k: task for k in range(per_task) if fits[k]})
    _starts(model, adapters, usable, per_task)
    loss = _demo_losses(model, prompts, adapters, demos, rows, len(tasks) * per_task, cfg, device, amp)
    best = {task: min((r for r in rows if rows[r] == task), key=lambda r: float(loss[r])) for task in usable}
    kept = model.task_adapters(len(tasks))
    with torch.no_grad():
        for name in ("latent", "gate_bias"):
            getattr(kept, name)[list(best)] = getattr(adapters, name)[list(best.values())]
    return kept, loss[[best.get(t, 0) for t in range(len(tasks))]]


def _test_time_groups(model: ArcModel, adapters: TaskAdapters | None, cfg: Config) -> tuple[list[dict], float]:
    """What test-time training moves -> (Adam groups, gradient clip): named groups of the shared
    weights, clipped like training (with `--ttt_view_rows`, each view's latent beside them, at the
    same lr, as VARC trains its task tokens with the network)."""
    e = cfg.eval
    # (tasks adapted together pass no adapter: fit_together stacks their view latents beside the weights)
    view_latents = [adapters.latent] if e.ttt_view_rows and adapters is not None else []
    return [{"params": [*model.ttt_parameters(), *view_latents], "lr": e.ttt_lr}], cfg.optim.clip


def _per_view(model: ArcModel, kept: TaskAdapters | None, tasks: int, cfg: Config) -> TaskAdapters:
    """`--ttt_view_rows`: every task's kept start (a fresh row without a search) copied to a row per
    view that test-time training draws from; each view is then an auxiliary task of its own."""
    if kept is None:
        kept = model.task_adapters(tasks)
    return kept.per_view(view_ids(cfg.eval.ttt_views))


@contextmanager
def adapted(model: ArcModel, prompts: QwenFeatures | None, tasks: list[ArcTask], eval_set: EpisodeDataset, *,
            cfg: Config, device: torch.device, stop: Callable[[], bool] = lambda: False,
            observe: Callable[[int, AdaptedTasks], None] | None = None,
            enough: Callable[[], bool] = lambda: False) -> Iterator[AdaptedTasks]:
    """Adapt to `tasks` together, each as it would be alone: its own demo episodes, its search over
    starts, then test-time training of its own copy of the shared weights; yields what prediction
    needs, and on exit the shared weights are as they were, bit for bit. `observe(steps, adapted)`: as
    `_fit`'s, with the model and the adapter as they are then (bench/ttt_curve.py). Training ends early
    when `stop()` says so (the caller then discards the result), and when `enough()` says its time is
    spent (the tasks are then predicted as adapted so far)."""
    e = cfg.eval
    if e.ttt_steps and len(tasks) > 1 and not batches_shared_weights(cfg):
        raise ValueError(f"--amp fp16 adapts the shared weights one task at a time (one loss scale a task), "
                         f"got {len(tasks)} tasks")
    result = AdaptedTasks(None, {t.task_id: i for i, t in enumerate(tasks)}, {t.task_id: float("nan") for t in tasks},
                          {t.task_id: 0 for t in tasks})
    demos = [DemoEpisodes([task], eval_set, cfg.run.seed, e.ttt_views) for task in tasks]
    usable = [k for k, d in enumerate(demos) if d.episodes[0]]  # a task of one demo has no episode
    if not usable or not (e.ttt_steps or _searches(model, cfg)):
        yield result
        return
    # one mixed-precision routine for the whole adaptation, its fp16 scaler started as training's
    amp = MixedPrecision(cfg.optim.amp, device, init_scale=cfg.optim.fp16_init_scale)
    with _shared_weights_kept(model, model.ttt_parameters() if e.ttt_steps else []):
        model.requires_grad_(False)
        kept, loss = _searched(model, prompts, tasks, demos, usable, cfg=cfg, device=device, amp=amp)
        if e.ttt_steps:
            if e.ttt_view_rows:  # a row per view of each task's kept start, trained with its weights
                kept = [_per_view(model, a, 1, cfg) for a in kept]
            loss = _trained(model, prompts, tasks, demos, kept, result, cfg=cfg, device=device, amp=amp,
                            stop=stop, enough=enough, observe=(lambda s: observe(s, result)) if observe else None)
        if any(a is not None for a in kept):  # a task not searched gets a fresh row, which changes nothing
            fresh = model.task_adapters(1)
            result.adapters = TaskAdapters.concat([a if a is not None else fresh for a in kept])
        result.demo_loss.update({tasks[k].task_id: loss[k] for k in usable})
        yield result


def _searched(model: ArcModel, prompts: QwenFeatures | None, tasks: list[ArcTask], demos: list[DemoEpisodes],
              usable: list[int], *, cfg: Config, device: torch.device,
              amp: MixedPrecision) -> tuple[list[TaskAdapters | None], dict[int, float]]:
    """Each usable task's view-start search alone -> (its kept start, a one-row adapter; None where
    nothing was searched), {task: its demo loss there})."""
    kept: list[TaskAdapters | None] = [None] * len(tasks)
    loss: dict[int, float] = {}
    for k in usable:
        kept[k], found = _search(model, prompts, [tasks[k]], demos[k], [0], cfg=cfg, device=device, amp=amp)
        if found is not None:
            loss[k] = float(found[0])
        demos[k].restart_draws()
    return kept, loss


def _trained(model: ArcModel, prompts: QwenFeatures | None, tasks: list[ArcTask], demos: list[DemoEpisodes],
             kept: list[TaskAdapters | None], result: AdaptedTasks, *, cfg: Config, device: torch.device,
             amp: MixedPrecision, stop: Callable[[], bool], enough: Callable[[], bool],
             observe: Callable[[int], None] | None) -> dict[int, float]:
    """Test-time training of each task's copy of the shared weights from its kept start: one task
    alone in the model's own weights (`_fit`: no task axis to vmap, and the loop --amp fp16 needs, one
    loss scale a task), several in one vmapped step (evaluation/task_batch.py; the copies in
    `result.weights`). Fills `result.steps` -> {task: its demo loss as adapted}."""
    observe = observe or (lambda steps: None)
    if len(tasks) == 1:
        result.adapters = kept[0]  # what `observe` reads
        groups, clip = _test_time_groups(model, kept[0], cfg)
        policy = TTTPolicy.test_time(cfg.eval, clip, stop, enough)
        result.steps[tasks[0].task_id] = _fit(model, prompts, kept[0], groups, demos[0], {0: 0}, policy, cfg=cfg,
                                              device=device, amp=amp, dropout=cfg.eval.ttt_dropout, observe=observe)
    else:
        groups, clip = _test_time_groups(model, None, cfg)
        policy = TTTPolicy.test_time(cfg.eval, clip, stop, enough)
        result.weights, taken = fit_together(model, prompts, groups[0]["params"], demos, kept, policy, cfg=cfg,
                                             device=device, amp=amp, observe=observe)
        result.steps.update({t.task_id: n for t, n in zip(tasks, taken, strict=True)})
    loss = {}
    for k, d in enumerate(demos):
        if d.episodes[0]:
            result.load(tasks[k].task_id)
            loss[k] = float(_demo_losses(model, prompts, kept[k], d, {0: 0}, 1, cfg, device, amp)[0])
    return loss
