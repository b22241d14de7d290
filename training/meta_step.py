"""Training through the adaptation it will meet (`--meta_steps K`): first-order MAML inside the step,
so the weights learn to predict well after validation's adaptation, not only as they are
(docs/adaptation.md item 6: cost, one process only, no fp16). For the first `--meta_tasks` episodes
of each micro-batch:

    fast  = the weights `--meta_params` names, copied (the rest shared as they are)
    K times: Adam at --meta_lr on the episode's context demos (adaptation_loss, the mean refinement,
             the episode's own prompt: the context is what that prompt was read from)
    g     = d/d fast of the query's adaptation_loss at the adapted copy

and `--meta_weight` x the mean g over the window's meta episodes is added to the shared weights' gradients.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from engine.config import Config
from loss_function import adaptation_loss
from model import ArcModel

# the batch's per-episode fields the model reads (data/episodes.collate); context_* are per demo slot
EPISODE_FIELDS = ("numeric", "relation", "ctrl", "task_row", "dihedral", "colours", "qwen", "qwen_present")


def episode_rows(batch: dict, i: int, rows: int) -> dict:
    """Episode i's prompt fields repeated `rows` times (its context demos read its prompt)."""
    return {k: batch[k][i:i + 1].expand(rows, *batch[k].shape[1:]) for k in EPISODE_FIELDS if k in batch}


def _loss(model: ArcModel, weights: dict[str, torch.Tensor], batch: dict, cfg: Config, amp) -> torch.Tensor:
    """The mean adaptation_loss of `batch` under `weights` (the model's own where not named)."""
    with amp.autocast():
        pred = functional_call(model, weights, (batch, "mean"), strict=False)
        logits, refined = pred.of("mean")
        return adaptation_loss(logits, refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss).mean()


def meta_gradient(model: ArcModel, batch: dict, cfg: Config, amp, window: list[dict]) -> dict:
    """Add `--meta_weight` / (the meta episodes of `window`, the step's micro-batches) x each meta
    episode's first-order gradient (module docstring) to the `--meta_params` weights' .grad, so the
    step adds their mean; batch: one of the window's micro-batches, collated and prompt-encoded,
    with context demos (input, target [B, S, S] int64; context_input, context_target [B, D, S, S]
    int64, context_present [B, D] bool). Episodes without a context demo are passed over; an episode
    whose outer gradient is not finite adds nothing and is counted. -> stats: the context demos'
    loss before and after the inner steps and the queries' loss after them (means over the episodes)."""
    weight = cfg.optim.meta_weight / sum(min(cfg.optim.meta_tasks, b["input"].shape[0]) for b in window)
    names = {id(p): n for n, p in model.named_parameters()}
    shared = [(names[id(p)], p) for p in model.ttt_parameters(cfg.optim.meta_params)]
    # each episode's demos fill its first slots; it adapts on --meta_demos of them at most
    demos = batch["context_present"][:, :cfg.optim.meta_demos].sum(1).tolist()
    before, after, query, nonfinite = [], [], [], 0
    for i in range(min(cfg.optim.meta_tasks, batch["input"].shape[0])):
        n = demos[i]
        if n == 0:
            continue
        context = {**episode_rows(batch, i, n), "input": batch["context_input"][i, :n],
                   "input_enclosed": batch["context_enclosed"][i, :n], "target": batch["context_target"][i, :n]}
        fast = {n: p.detach().clone().requires_grad_(True) for n, p in shared}
        inner = torch.optim.Adam(fast.values(), lr=cfg.optim.meta_lr, fused=True)
        for step in range(cfg.optim.meta_steps):
            loss = _loss(model, fast, context, cfg, amp)
            if step == 0:
                before.append(loss.detach())
            inner.zero_grad(set_to_none=True)
            loss.backward(inputs=list(fast.values()))
            inner.step()
        with torch.no_grad():
            after.append(_loss(model, fast, context, cfg, amp))
        q = {**episode_rows(batch, i, 1), "input": batch["input"][i:i + 1],
             "input_enclosed": batch["input_enclosed"][i:i + 1], "target": batch["target"][i:i + 1]}
        outer = _loss(model, fast, q, cfg, amp)
        grads = torch.autograd.grad(outer, list(fast.values()), allow_unused=True)
        present = [g for g in grads if g is not None]
        if present and not bool(torch.stack([torch.isfinite(g).all() for g in present]).all()):  # one sync
            nonfinite += 1
            continue
        query.append(outer.detach())
        for (_, p), g in zip(shared, grads, strict=True):
            if g is not None:
                p.grad = weight * g if p.grad is None else p.grad.add_(g, alpha=weight)
    def mean(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(xs).mean() if xs else torch.tensor(float("nan"))

    return {"meta/context_loss_before": mean(before), "meta/context_loss_after": mean(after),
            "meta/query_loss": mean(query), "meta/episodes": float(len(query)), "meta/nonfinite": float(nonfinite)}
