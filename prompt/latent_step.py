"""LPN's latent gradient step, inside the model: the demos move the prompt before the query is read.

Before the agent predicts a query, its refined prompt r takes one gradient step on how well the
agent, reading r, reproduces the episode's context demos:

    z = -lr * d/dz  mean over the query's context demos c of  CE(agent(c.input, r + z), c.output)  at z = 0
    the query is predicted from r + z

First order: the gradient enters the outer loss as a constant, so the outer backward never runs
through the inner one (a training step costs about 1.5x on a CPU, not 3x); the agent still learns
to read a prompt moved along the demos' gradient, which is what makes a latent search at test
time (evaluation/adaptation.py) move it somewhere useful. The step size is learned, as its log, from
`--latent_step_lr`, and a step is at most half as long as the prompt it moves: early in training
the demos' gradient is large, and unbounded steps (norms of 90-140 against a prompt of ~25, at lr
10) held the training loss at 25-35 for a thousand steps. Only the context demos (never the
query's output) enter z: at evaluation they are the task's demos, in training the other demos of
a leave-one-out episode.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from agents.adapter import AdapterSlice
from loss_function import cell_log_likelihood

MAX_STEP_RATIO = 0.5  # a step's norm at most this share of the prompt's norm


class LatentStep(nn.Module):
    def __init__(self, lr: float):
        super().__init__()
        if lr <= 0:
            raise ValueError(f"latent step lr must be > 0, got {lr}")
        self.log_lr = nn.Parameter(torch.tensor(math.log(lr)))

    def forward(self, agent: nn.Module, refined: torch.Tensor, context_input: torch.Tensor,
                context_target: torch.Tensor, owner: torch.Tensor, adapter: AdapterSlice | None = None,
                context_enclosed: torch.Tensor | None = None) -> torch.Tensor:
        """refined [B, P] float (the prompt the step starts from; read detached); context_input,
        context_target [N, S, S] int64 (every sample's context demos, one after another); owner [N]
        int64 (the sample each demo belongs to); adapter: the B samples' adapter rows, in their
        frames; context_enclosed [N, S, S] bool, the demos' enclosed background (None: the agent
        computes it). -> z [B, P] float32 (zero for a sample without context demos); it carries a gradient
        to the step size only."""
        start = refined.detach()
        if owner.numel() == 0:  # no sample has a context demo
            return torch.zeros(start.shape, dtype=torch.float32, device=start.device) * self.log_lr.exp()
        with torch.enable_grad():  # validation and adaptation run the model under no_grad
            z = torch.zeros(start.shape, dtype=torch.float32, device=start.device, requires_grad=True)
            rows = None if adapter is None else adapter.take(owner)
            logits = agent(context_input, start[owner] + z[owner].to(start.dtype), rows, context_enclosed)
            per_demo = -cell_log_likelihood(logits, context_target, context_input)  # [N]
            demos = torch.zeros(start.shape[0], device=start.device).index_add(0, owner, torch.ones_like(per_demo))
            loss = (per_demo / demos[owner]).sum()  # each sample's mean over its own demos
            (grad,) = torch.autograd.grad(loss, z)
        step = -self.log_lr.exp() * grad
        longest = MAX_STEP_RATIO * start.float().norm(dim=-1, keepdim=True)
        return step * (longest / step.norm(dim=-1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
