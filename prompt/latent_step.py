"""LPN's latent gradient step, inside the model: the demos move the refined prompt r before the query
is read (docs/adaptation.md, "The latent step inside the model"; never the query's output).

    z = -lr * d/dz  mean over the query's context demos c of  CE(agent(c.input, r + z), c.output)  at z = 0
    the query is predicted from r + z

First order: the gradient enters the outer loss as a constant, so the outer backward never runs
through the inner one. The step size is learned, as its log; a step is at most half as long as the
prompt it moves: early in training the demos' gradient is large, and unbounded steps (norms of
90-140 against a prompt of ~25, at lr 10) held the training loss at 25-35 for a thousand steps.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from agents.adapter import AdapterSlice
from loss_function import cell_log_likelihood

MAX_STEP_RATIO = 0.5  # a step's norm at most this share of the prompt's norm


class LatentStep(nn.Module):
    def __init__(self, lr: float, demos: int | None = None):
        """`lr`: the first step size; `demos`: the context demos of a sample it reads at most
        (`--latent_step_demos`; the batch may carry more, for a demo stream reading more; None: all)."""
        super().__init__()
        if lr <= 0:
            raise ValueError(f"latent step lr must be > 0, got {lr}")
        self.log_lr = nn.Parameter(torch.tensor(math.log(lr)))
        self.demos = demos

    def forward(self, agent: nn.Module, refined: torch.Tensor, context_input: torch.Tensor,
                context_target: torch.Tensor, present: torch.Tensor, adapter: AdapterSlice | None = None,
                context_enclosed: torch.Tensor | None = None) -> torch.Tensor:
        """refined [B, P] float (the prompt the step starts from; read detached); context_input,
        context_target [B, D, S, S] int64 and present [B, D] bool (each sample's context demos in
        slots, data.episodes.collate; the agent runs on every slot, an empty one adding nothing: a
        task's adaptation batches carry the evaluation set's fixed count, so a task of few demos
        pays for empty slots);
        adapter: the B samples' adapter rows, in their frames; context_enclosed [B, D, S, S] bool,
        the demos' enclosed background (None: the agent computes it). -> z [B, P] float32 (zero for
        a sample without context demos); it carries a gradient to the step size only."""
        start = refined.detach()
        if present.shape[1] == 0:  # no sample has a context demo (a batch of one-demo tasks)
            return torch.zeros(start.shape, dtype=torch.float32, device=start.device) * self.log_lr.exp()
        context = (context_input, context_target, present, context_enclosed)
        if self.demos is not None:
            context = tuple(None if t is None else t[:, :self.demos] for t in context)
        x, y, present, enclosed = context
        b, d = present.shape
        owner = torch.arange(b, device=start.device).repeat_interleave(d)  # [B*D]: each slot's sample
        with torch.enable_grad():  # validation and adaptation run the model under no_grad
            z = torch.zeros(start.shape, dtype=torch.float32, device=start.device, requires_grad=True)
            rows = None if adapter is None else adapter.take(owner)
            logits = agent(x.flatten(0, 1), start[owner] + z[owner].to(start.dtype), rows,
                           None if enclosed is None else enclosed.flatten(0, 1))
            per_demo = -cell_log_likelihood(logits, y.flatten(0, 1), x.flatten(0, 1)).view(b, d)
            weight = present.to(per_demo.dtype)
            # each sample's mean over its own demos
            loss = (per_demo * weight / weight.sum(1, keepdim=True).clamp_min(1.0)).sum()
            (grad,) = torch.autograd.grad(loss, z)
        step = -self.log_lr.exp() * grad
        longest = MAX_STEP_RATIO * start.float().norm(dim=-1, keepdim=True)
        return step * (longest / step.norm(dim=-1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
