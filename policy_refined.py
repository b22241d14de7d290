"""Prompt refinement with an RL head.

    refined = refine(prompt, ctrl_vec, feat_sum) + U @ a,    a ~ N(mu(x), diag(sigma^2)),  x detached

- `refine()` is a residual MLP trained by the main loss; it has no `no_grad`, so gradients reach the
  prompt encoder (and Qwen, when it trains) through it.
- The RL head is a Gaussian policy over a low-rank delta: `U` [P, rank] is a fixed random orthonormal
  basis, `mu` a small MLP of the detached inputs, the log-std a learned vector clamped to a range.
  It is trained only by `update()`, REINFORCE with a moving-average baseline and its own optimizer,
  which runs after the main optimizer step on detached tensors: it never touches the main graph,
  so it can never backward through it a second time. The main optimizer never holds its
  parameters (ArcModel.parameter_groups keeps them apart).

Inputs: ctrl_vec [B, 3] float32, the curriculum controls (data.episodes.CTRL_FEATURES); feat_sum
[B, 15] float32, the numeric task summary (data.features.NUMERIC_FEATURES).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.distributed import Dist
from engine.loop import host_to_device

# What the agent may be given as the refined prompt, by name (ArcModel.forward).
REFINEMENTS = ("mean", "sampled", "zero", "sampled+mean")
HIDDEN = 256  # the refinement MLP's width; the RL head's is half
BASELINE_MOMENTUM = 0.9  # REINFORCE's moving-average baseline
LOG_STD_INIT, LOG_STD_BOUNDS = -1.0, (-5.0, 0.5)  # the RL head's log-std: at start, and clamped to


class RefineMLP(nn.Module):
    """Residual refinement: prompt + MLP([prompt, ctrl, feat]); starts as the identity."""

    def __init__(self, *, prompt_dim: int, ctrl_dim: int, feat_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(prompt_dim + ctrl_dim + feat_dim, HIDDEN), nn.GELU(),
                                 nn.Linear(HIDDEN, prompt_dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, prompt: torch.Tensor, ctrl: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return prompt + self.net(torch.cat([prompt, ctrl.to(prompt.dtype), feat.to(prompt.dtype)], -1))


class GaussianHead(nn.Module):
    """mu(x) [B, rank] and a clamped, learned log-std [rank]; `baseline` is REINFORCE's moving average."""

    def __init__(self, *, in_dim: int, rank: int):
        super().__init__()
        self.mu = nn.Sequential(nn.Linear(in_dim, HIDDEN // 2), nn.Tanh(), nn.Linear(HIDDEN // 2, rank))
        nn.init.zeros_(self.mu[-1].weight)
        nn.init.zeros_(self.mu[-1].bias)
        self.log_std = nn.Parameter(torch.full((rank,), LOG_STD_INIT))
        self.register_buffer("baseline", torch.zeros(()))

    def std(self) -> torch.Tensor:
        """[rank]: the policy's standard deviation, the same for every input."""
        return self.log_std.clamp(*LOG_STD_BOUNDS).exp()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu(x), self.std()


@dataclass
class RLInfo:
    """What the RL update needs, all detached: head input x [B, in], action a [B, rank]."""

    head_input: torch.Tensor
    action: torch.Tensor


class PolicyRefiner(nn.Module):
    def __init__(self, *, prompt_dim: int, ctrl_dim: int, feat_dim: int, rank: int = 8, seed: int = 0,
                 noise_seed: int | None = None):
        """The basis and the initial weights follow `seed` (identical on every process); the action
        noise follows `noise_seed` (default `seed`), so several processes explore differently."""
        super().__init__()
        self.refiner = RefineMLP(prompt_dim=prompt_dim, ctrl_dim=ctrl_dim, feat_dim=feat_dim)
        self.head = GaussianHead(in_dim=prompt_dim + ctrl_dim + feat_dim, rank=rank)
        basis = torch.linalg.qr(torch.randn(prompt_dim, rank, generator=torch.Generator().manual_seed(seed + 7919)))[0]
        self.register_buffer("basis", basis)  # U [P, rank], orthonormal columns, fixed
        # On the CPU whatever the device: the draws are tiny, and a run draws the same noise anywhere.
        self.noise = torch.Generator().manual_seed((seed if noise_seed is None else noise_seed) + 104729)

    def refine(self, prompt: torch.Tensor, ctrl_vec: torch.Tensor, feat_sum: torch.Tensor) -> torch.Tensor:
        """Deterministic refinement [B, P] (dtype of prompt), with gradients to the prompt."""
        return self.refiner(prompt, ctrl_vec, feat_sum)

    @staticmethod
    def _head_input(prompt: torch.Tensor, ctrl_vec: torch.Tensor, feat_sum: torch.Tensor) -> torch.Tensor:
        """[B, P + 3 + 15] float32, detached: the RL head never sends gradients into the main graph."""
        return torch.cat([prompt.detach().float(), ctrl_vec.float(), feat_sum.float()], -1)

    def refinements(self, prompt: torch.Tensor, ctrl_vec: torch.Tensor, feat_sum: torch.Tensor,
                    which: str) -> tuple[torch.Tensor, RLInfo | None]:
        """-> (refined prompts [K, B, P], one per name in `which`; RLInfo when a delta was sampled).

        which: "mean" (the head's mean delta; draws no random number, so validating never shifts
        the training noise), "sampled" (a delta drawn from the head), "zero" (an all-zero prompt:
        the ablation without task information), or "sampled+mean" (K = 2, what training uses).
        prompt [B, P] float, ctrl_vec [B, 3] float32, feat_sum [B, 15] float32. The head runs in
        float32 outside autocast: it is tiny, and its log-probabilities must be exact.
        """
        if which not in REFINEMENTS:
            raise ValueError(f"refinement {which!r}: choose one of {', '.join(REFINEMENTS)}")
        if which == "zero":
            return torch.zeros_like(prompt)[None], None
        base = self.refine(prompt, ctrl_vec, feat_sum)
        with torch.no_grad(), torch.autocast(prompt.device.type, enabled=False):
            x = self._head_input(prompt, ctrl_vec, feat_sum)
            mu, std = self.head(x)
        basis = self.basis.to(base.dtype)
        mean = base + mu.to(base.dtype) @ basis.T
        if which == "mean":
            return mean[None], None
        noise = host_to_device(torch.randn(mu.shape, generator=self.noise), mu.device)
        action = mu + std * noise
        sampled = base + action.to(base.dtype) @ basis.T
        refined = torch.stack([sampled, mean]) if which == "sampled+mean" else sampled[None]
        return refined, RLInfo(x, action)

    def update(self, info: RLInfo, reward: torch.Tensor, optimizer: torch.optim.Optimizer,
               dist: Dist = Dist(), head: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """One REINFORCE step of the head on the signed reward [B] float32 (never clipped to positive).

        Builds its own small graph from the detached `info`, so it is independent of the main one.
        With several processes the head's gradients (through `head`, the head under DDP) and the
        baseline are averaged over them, so the head stays identical everywhere.
        """
        with torch.autocast(reward.device.type, enabled=False):
            mu, std = (head if head is not None else self.head)(info.head_input)
            # no argument checks: each is a host synchronization, and std is an exp (positive by construction)
            log_prob = torch.distributions.Normal(mu, std, validate_args=False).log_prob(info.action).sum(-1)
            advantage = reward.detach().float() - self.head.baseline
            loss = -(advantage * log_prob).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            self.head.baseline.mul_(BASELINE_MOMENTUM).add_((1 - BASELINE_MOMENTUM) * dist.mean(reward.mean()))
        return {"rl/loss": loss.detach(), "rl/advantage": advantage.mean().detach(),
                "rl/baseline": self.head.baseline.detach().clone(), "rl/std": std.mean().detach()}
