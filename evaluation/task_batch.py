"""Test-time training of the shared weights for several tasks in one step (docs/adaptation.md, "On a GPU").

Each task's copy of the weights test-time training adapts is stacked along a leading task axis ([K, ...] for K
tasks); one vmapped forward and backward serves all K, and one Adam steps the stacks. Adam works per element
and each task's loss reads only its own copy, so every task moves exactly as it would alone
(evaluation/adaptation._fit; tests/test_task_batch.py; under `--amp bf16` to its rounding: a vmapped sum
rounds in another order). The model's own weights are never written here: `TaskWeights.load` puts a task's
copy into them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from data.demo_episodes import DemoEpisodes
from engine.config import Config
from engine.loop import host_to_device, to_device
from engine.precision import MixedPrecision
from engine.schedule import set_lrs
from evaluation.ttt_dropout import DropoutMasks, change_shapes, dropped_changes
from evaluation.ttt_policy import TTTPolicy
from loss_function import adaptation_loss
from model import AdapterSlice, ArcModel, TaskAdapters
from prompt import QwenFeatures


def batches_shared_weights(cfg: Config) -> bool:
    """Whether test-time training of the shared weights adapts `--adapt_tasks` tasks together (else one
    task at a time): not under fp16 (one loss scale for all)."""
    return cfg.eval.ttt_steps > 0 and cfg.optim.amp != "fp16"


@dataclass
class TaskWeights:
    """Each task's adapted copy of the shared weights `params` (the model's own parameters), stacked:
    stacks[i] [K, *params[i].shape], task k's copy at index k."""

    params: list[nn.Parameter]
    stacks: list[torch.Tensor]

    @torch.no_grad()
    def load(self, k: int) -> None:
        """Task k's copy into the model's own parameters."""
        for p, stack in zip(self.params, self.stacks, strict=True):
            p.copy_(stack[k])


def fit_together(model: ArcModel, prompts: QwenFeatures | None, params: list[nn.Parameter],
                 demos: list[DemoEpisodes], adapters: list[TaskAdapters | None], policy: TTTPolicy, *, cfg: Config,
                 device: torch.device, amp: MixedPrecision,
                 observe: Callable[[int], None]) -> tuple[TaskWeights, list[int]]:
    """Test-time training of `params` for K tasks together under `policy` (evaluation/ttt_policy.py, as
    one task alone, with each task's own clip; a non-finite gradient ends that task), task k on its demos
    `demos[k]` (one task each, every pool of one side) read with its adapter `adapters[k]` (one row, fixed;
    with `--ttt_view_rows` a row per view, whose latents train with the weights and end written back into it;
    None without one). A stopped task keeps its copy. `observe` as adaptation._fit's. -> (each task's adapted
    copy, the steps each took)."""
    e = cfg.eval
    k_tasks = len(demos)
    names = {id(p): name for name, p in model.named_parameters()}
    keys = [names[id(p)] for p in params]
    # plain tensors: torch.func gives the gradients, set on them by hand, and Adam steps what has one
    stacks = [p.detach().unsqueeze(0).repeat(k_tasks, *([1] * p.dim())) for p in params]
    weights = TaskWeights(params, stacks)
    if e.ttt_view_rows:  # each task's view latents: one more copy, in the same Adam group and clip
        keys.append(LATENT)
        stacks = [*stacks, torch.stack([a.latent.detach() for a in adapters])]
    optimizer = torch.optim.Adam(stacks, lr=e.ttt_lr, fused=True)
    task_grads = _TaskGradients(model, prompts, demos, adapters, cfg, device, amp)
    active = [bool(d.episodes[0]) for d in demos]  # a task of one demo has no episode to train on
    kept: dict[int, list[torch.Tensor]] = {}  # a task stopped: its copy as it stopped
    taken = [0] * k_tasks

    def stop_task(k: int) -> None:
        active[k] = False
        kept[k] = [s[k].clone() for s in stacks]

    tried = 0
    observe(tried)
    while policy.goes_on(tried) and any(active):
        set_lrs(optimizer, [e.ttt_lr], policy.lr_factor(tried))
        tried += 1
        ks = [k for k in range(k_tasks) if active[k]]
        grads = task_grads(ks, {key: s if len(ks) == k_tasks else s[ks] for key, s in zip(keys, stacks, strict=True)})
        for k, finite in zip(ks, _set_clipped(grads, stacks, keys, ks, policy), strict=True):
            taken[k] += finite
            if not finite:  # the policy: the task keeps its copy from before this step
                stop_task(k)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        observe(tried)
    for k, copy in kept.items():
        for s, c in zip(stacks, copy, strict=True):
            s[k] = c
    _latents_into_adapters(stacks, adapters, [k for k in range(k_tasks) if adapters[k] is not None], e.ttt_view_rows)
    return weights, taken


def _latents_into_adapters(stacks: list[torch.Tensor], adapters: list[TaskAdapters | None], ks: list[int],
                           view_rows: bool) -> None:
    """With --ttt_view_rows: tasks ks' trained view latents (the last stack) written into their adapters."""
    if view_rows:
        with torch.no_grad():
            for k in ks:
                adapters[k].latent.copy_(stacks[-1][k])


class _TaskGradients:
    """One step's gradient of each active task under its own copy: (ks, copies {key: [len(ks), ...]})
    -> {key: [len(ks), ...]}, vmapped over the tasks, each drawing its own episodes and dropout masks."""

    def __init__(self, model: ArcModel, prompts: QwenFeatures | None, demos: list[DemoEpisodes],
                 adapters: list[TaskAdapters | None], cfg: Config, device: torch.device, amp: MixedPrecision):
        self.model, self.prompts, self.demos, self.adapters = model, prompts, demos, adapters
        self.cfg, self.device, self.amp = cfg, device, amp
        e = cfg.eval
        self.masks = [DropoutMasks(e.ttt_dropout, d.seed, device) for d in demos] if e.ttt_dropout else None
        self.shapes: list[torch.Size] | None = None  # each block call's change, the same for every task of one side
        self.grad = grad(_task_loss(model, cfg))

    def __call__(self, ks: list[int], copies: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch, slices, rows = _stacked_draws(self.model, self.prompts, [self.demos[k] for k in ks],
                                             [self.adapters[k] for k in ks], self.cfg.eval.ttt_batch_size, self.device)
        drawn = None
        if self.masks is not None:
            if self.shapes is None:  # one task's forward, outside vmap
                first = ({key: c[0] for key, c in copies.items()}, {name: v[0] for name, v in batch.items()},
                         None if slices is None else tuple(t[0] for t in slices), rows[0], None)
                self.shapes = change_shapes(self.model, partial(_task_loss(self.model, self.cfg), *first))
            drawn = [torch.stack([self.masks[k].draw(shape) for k in ks]) for shape in self.shapes]
        with self.amp.autocast():
            return vmap(self.grad, in_dims=(0, 0, 0 if slices is not None else None, 0, 0 if drawn else None),
                        randomness="error")(copies, batch, slices, rows, drawn)


def _set_clipped(grads: dict[str, torch.Tensor], stacks: list[torch.Tensor], keys: list[str], ks: list[int],
                 policy: TTTPolicy) -> list[bool]:
    """Active tasks ks' gradients, each clipped by its own norm under `policy`, set on the stacks
    (zero for the tasks not active) -> whether each task's gradient is finite (one host read a step,
    as amp.step's norm)."""
    # each active task's own gradient norm [len(ks)], as clip_grad_norm_ takes it over one task's weights
    norms = torch.stack([g.reshape(len(ks), -1).float().pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
    finite = torch.isfinite(norms).tolist()
    scale = policy.clip_factor(norms)
    for key, s in zip(keys, stacks, strict=True):
        # contiguous, as the stack is: vmap returns gradients in whatever strides its rules chose,
        # and fused Adam reads a gradient's memory in its parameter's layout (measured: a [K, 30, C]
        # embedding gradient moved task 0's rows by the other tasks' gradients)
        g = (grads[key] * scale.view(-1, *([1] * (grads[key].dim() - 1))).to(grads[key].dtype)).contiguous()
        s.grad = g if len(ks) == len(s) else torch.zeros_like(s).index_copy_(0, torch.tensor(ks, device=s.device), g)
    return finite


LATENT = "adapter.latent"  # the stacked copies' key of each task's view latents (not a model parameter)


def _task_loss(model: ArcModel, cfg: Config) -> Callable:
    """The mean adaptation loss of one task's batch under its copy of the weights: a function of
    (copy {name: tensor, and LATENT: its view latents [V, P] with --ttt_view_rows}, batch of tensors,
    adapter slice tensors or None, the adapter row of each sample [B] int64 (where its latent is
    read), its dropout masks (a list, one a block call) or None) -> [] float32, for vmap(grad(.))
    over the task axis."""
    def loss(copy: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], adapter: tuple[torch.Tensor, ...] | None,
             rows: torch.Tensor, masks: list[torch.Tensor] | None) -> torch.Tensor:
        copy = dict(copy)
        latent = copy.pop(LATENT, None)
        slice_ = AdapterSlice(*adapter) if adapter is not None else None
        if latent is not None:
            slice_ = replace(slice_, latent=latent[rows])
        each = iter(masks) if masks is not None else None  # the masks in block-call order
        with dropped_changes(model, (lambda shape: next(each)) if each is not None else None):
            pred = functional_call(model, copy, (batch, "mean", slice_), strict=False)
        logits, refined = pred.of("mean")
        per_sample = adaptation_loss(logits, refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
        return per_sample.float().mean()
    return loss


def _stacked_draws(model: ArcModel, prompts: QwenFeatures | None, demos: list[DemoEpisodes],
                   adapters: list[TaskAdapters | None], per_task: int, device: torch.device
                   ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...] | None, torch.Tensor]:
    """One step's episodes: `per_task` drawn from each task's own stream, each task's batch with its
    prompt features, stacked along a leading task axis -> (batch {name: [K, B, ...]}, the adapter
    rows of each sample as AdapterSlice's tensors [K, B, ...], or None without adapters: the tasks
    have one each or none; the row of its task's adapter each sample reads [K, B] int64)."""
    draws = [d.draw({0: 0}, per_task) for d in demos]
    # stacked on the host and copied once, and every task's prompt features in one read of the cache:
    # a fixed count of copies and lookups a step, whatever the number of tasks
    stacked = to_device({name: torch.stack([batch[name] for batch, _ in draws])
                         for name, v in draws[0][0].items() if torch.is_tensor(v)}, device)
    tasks_by_samples = stacked["numeric"].shape[:2]
    flat = model.encode_prompts({"demo_texts": [t for batch, _ in draws for t in batch["demo_texts"]],
                                 "numeric": stacked["numeric"].flatten(0, 1)}, prompts, 0, training=False)
    stacked.update({name: flat[name].unflatten(0, tasks_by_samples) for name in ("qwen", "qwen_present")
                    if name in flat})
    of = host_to_device(torch.stack([of for _, of in draws]), device)
    rows, slices = [], []
    for k, (batch, _) in enumerate(draws):
        views = [a.aug_id for a in batch["augmentation"]]
        rows.append(adapters[k].rows(of[k], views) if adapters[k] is not None else of[k])
        if adapters[k] is not None:
            slices.append(tuple(vars(adapters[k].at(rows[-1])).values()))
    return (stacked, tuple(torch.stack(parts) for parts in zip(*slices, strict=True)) if slices else None,
            torch.stack(rows))
