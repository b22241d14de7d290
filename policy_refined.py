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

Inputs:
- ctrl_vec [B, 3] float32: the episode's curriculum controls (data.episodes.CTRL_FEATURES:
  difficulty percentile, is_easy, is_augmented).
- feat_sum [B, 15] float32: the numeric task summary (data.features.NUMERIC_FEATURES).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from engine.distributed import Dist

# What the agent may be given as the refined prompt, by name (ArcModel.forward).
REFINEMENTS = ("mean", "sampled", "zero", "sampled+mean")


class RefineMLP(nn.Module):
    """Residual refinement: prompt + MLP([prompt, ctrl, feat]); starts as the identity."""

    def __init__(self, *, prompt_dim: int, ctrl_dim: int, feat_dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(prompt_dim + ctrl_dim + feat_dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, prompt_dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, prompt: torch.Tensor, ctrl: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return prompt + self.net(torch.cat([prompt, ctrl.to(prompt.dtype), feat.to(prompt.dtype)], -1))


class GaussianHead(nn.Module):
    """mu(x) [B, rank] and a clamped, learned log-std [rank]; `baseline` is REINFORCE's moving average."""

    def __init__(self, *, in_dim: int, rank: int, hidden: int, log_std_init: float,
                 log_std_bounds: tuple[float, float]):
        super().__init__()
        self.mu = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, rank))
        nn.init.zeros_(self.mu[-1].weight)
        nn.init.zeros_(self.mu[-1].bias)
        self.log_std = nn.Parameter(torch.full((rank,), log_std_init))
        self.log_std_bounds = log_std_bounds
        self.register_buffer("baseline", torch.zeros(()))

    def std(self) -> torch.Tensor:
        """[rank]: the policy's standard deviation, the same for every input."""
        return self.log_std.clamp(*self.log_std_bounds).exp()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu(x), self.std()


@dataclass
class RLInfo:
    """What the RL update needs, all detached: head input x [B, in], action a [B, rank]."""

    head_input: torch.Tensor
    action: torch.Tensor


class PolicyRefiner(nn.Module):
    def __init__(self, *, prompt_dim: int, ctrl_dim: int, feat_dim: int, rank: int = 8, hidden: int = 256,
                 baseline_momentum: float = 0.9, log_std_init: float = -1.0,
                 log_std_bounds: tuple[float, float] = (-5.0, 0.5), seed: int = 0, noise_seed: int | None = None):
        """The basis and the initial weights follow `seed` (identical on every process); the action
        noise follows `noise_seed` (default `seed`), so several processes explore differently."""
        super().__init__()
        self.refiner = RefineMLP(prompt_dim=prompt_dim, ctrl_dim=ctrl_dim, feat_dim=feat_dim, hidden=hidden)
        self.head = GaussianHead(in_dim=prompt_dim + ctrl_dim + feat_dim, rank=rank, hidden=hidden // 2,
                                 log_std_init=log_std_init, log_std_bounds=log_std_bounds)
        basis = torch.linalg.qr(torch.randn(prompt_dim, rank, generator=torch.Generator().manual_seed(seed + 7919)))[0]
        self.register_buffer("basis", basis)  # U [P, rank], orthonormal columns, fixed
        self.momentum = baseline_momentum
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
        noise = torch.randn(mu.shape, generator=self.noise).to(mu.device, non_blocking=True)
        action = mu + std * noise
        sampled = base + action.to(base.dtype) @ basis.T
        refined = torch.stack([sampled, mean]) if which == "sampled+mean" else sampled[None]
        return refined, RLInfo(x, action)

    def draw_deltas(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n draws of the head's Gaussian around its mean, as prompt deltas U (a - mu) [n, P] float32:
        the starts a latent search tries beside the mean."""
        std = self.head.std().detach()
        noise = torch.randn(n, std.shape[-1], generator=generator).to(std.device)
        return (std * noise) @ self.basis.T

    def update(self, info: RLInfo, reward: torch.Tensor, optimizer: torch.optim.Optimizer,
               dist: Dist = Dist(), head: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """One REINFORCE step of the head on the signed reward [B] float32 (never clipped to positive).

        Builds its own small graph from the detached `info`, so it is independent of the main one.
        With several processes the head's gradients (through `head`, the head under DDP) and the
        baseline are averaged over them, so the head stays identical everywhere.
        """
        with torch.autocast(reward.device.type, enabled=False):
            mu, std = (head if head is not None else self.head)(info.head_input)
            log_prob = torch.distributions.Normal(mu, std).log_prob(info.action).sum(-1)
            advantage = reward.detach().float() - self.head.baseline
            loss = -(advantage * log_prob).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            self.head.baseline.mul_(self.momentum).add_((1 - self.momentum) * dist.mean(reward.mean()))
        return {"rl/loss": loss.detach(), "rl/advantage": advantage.mean().detach(),
                "rl/baseline": self.head.baseline.detach().clone(), "rl/std": std.mean().detach()}


def plackett_luce_two(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Two draws without replacement from softmax(logits) of each row, the second from what the first
    left (Plackett-Luce), by the Gumbel top-2 trick. logits [B, N] float32 (-inf: not a candidate) ->
    indices [B, min(2, N)] int64; a row with one candidate gives a -inf one second."""
    u = torch.rand(logits.shape, generator=generator).clamp(1e-12, 1 - 1e-7)
    return (logits - torch.log(-torch.log(u))).topk(min(2, logits.shape[-1]), dim=-1).indices


class AttemptChooser(nn.Module):
    """The RL head's test-time job: a policy over one test input's candidates that picks the two attempts.

    A small MLP scores each candidate from its features (evaluation/choice.py FEATURES, [N, F]
    float32); the policy is the softmax over the candidates, the two attempts drawn one after the
    other without replacement (Plackett-Luce), and at test time the two best scores. Trained by
    `update`, REINFORCE with the exact-match reward and a moving-average baseline, like the head,
    on test pairs whose outputs may be read (training/chooser.py); `features` names its inputs, so
    a chooser is never read against other features.
    """

    def __init__(self, features: tuple[str, ...], hidden: int = 32, baseline_momentum: float = 0.9,
                 votes_prior: float = 0.0):
        super().__init__()
        self.features, self.hidden, self.votes_prior = tuple(features), hidden, votes_prior
        if votes_prior and "votes_rank" not in self.features:
            raise ValueError("a chooser with a votes prior reads the feature votes_rank")
        self.net = nn.Sequential(nn.Linear(len(features), hidden), nn.Tanh(), nn.Linear(hidden, 1))
        if votes_prior:  # it starts as the votes' ranking and learns where leaving it pays
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)
        self.momentum = baseline_momentum
        self.register_buffer("baseline", torch.zeros(()))

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, F] float32 -> scores [N] float32 (the policy's logits): the MLP's, plus
        votes_prior x log(votes_rank) = -votes_prior x log(1 + the candidate's rank by votes)."""
        if features.shape[-1] != len(self.features):
            raise ValueError(f"the chooser reads {len(self.features)} features a candidate, got {features.shape[-1]}")
        out = self.net(features).squeeze(-1)
        if self.votes_prior:
            out = out + self.votes_prior * features[..., self.features.index("votes_rank")].log()
        return out

    @torch.no_grad()
    def best_two(self, features) -> tuple[int, int]:
        """features [N, F] float32 (array or tensor) -> indices of the two best candidates (the same
        twice when there is one)."""
        s = self.scores(torch.as_tensor(features, dtype=torch.float32))
        order = torch.argsort(s, descending=True, stable=True).tolist()
        return order[0], order[min(1, len(order) - 1)]

    def update(self, sets: list[tuple[torch.Tensor, torch.Tensor]], optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        """One REINFORCE step over candidate sets, each (features [N, F] float32, hits [N] bool: the
        candidate is the test output). Two attempts are drawn from each set (one from a set of one);
        the reward is 1 when either is a hit (pass@2), the advantage that minus the baseline.

        The sets are padded into one batch [B, N_max] and drawn by the Gumbel top-2 trick: the two
        largest of logits + Gumbel noise are distributed as two Plackett-Luce draws without
        replacement, so one batched forward replaces a loop over the sets."""
        sizes = torch.tensor([len(h) for _, h in sets])
        width = int(sizes.max())
        real = torch.arange(width) < sizes[:, None]  # [B, N_max]
        features = torch.zeros(len(sets), width, len(self.features))
        hits = torch.zeros(len(sets), width, dtype=torch.bool)
        for i, (f, h) in enumerate(sets):
            features[i, : len(h)], hits[i, : len(h)] = f, h
        logits = self.scores(features).masked_fill(~real, float("-inf"))  # [B, N_max]
        drawn = plackett_luce_two(logits.detach(), generator)
        first = drawn[:, :1]
        log_prob = logits.log_softmax(-1).gather(1, first)[:, 0]
        reward = hits.gather(1, first)[:, 0]
        if width > 1:
            pair = sizes > 1  # a set of one draws once; its other row is kept finite (no NaN in backward)
            rest = logits.masked_fill(torch.arange(width) == first, float("-inf"))
            rest = torch.where(pair[:, None], rest, torch.zeros_like(rest))
            second = drawn[:, 1:]
            log_prob = log_prob + torch.where(pair, rest.log_softmax(-1).gather(1, second)[:, 0], 0.0)
            reward = reward | (pair & hits.gather(1, second)[:, 0])
        reward = reward.float()
        advantage = reward - self.baseline
        loss = -(advantage * log_prob).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            self.baseline.mul_(self.momentum).add_((1 - self.momentum) * reward.mean())
        return {"loss": loss.item(), "reward": reward.mean().item(), "baseline": self.baseline.item()}

    def save(self, path: Path, trained_on: dict) -> None:
        """The weights and baseline as safetensors, with the feature names and `trained_on` (what
        it was trained on, for the record) in the header."""
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(path),
                  metadata={"features": json.dumps(self.features), "hidden": str(self.hidden),
                            "votes_prior": str(self.votes_prior), "trained_on": json.dumps(trained_on)})

    @classmethod
    def load(cls, path: Path, features: tuple[str, ...]) -> AttemptChooser:
        """A chooser `save` wrote; ValueError naming the file when it reads other features than `features`."""
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            weights = {k: f.get_tensor(k) for k in f.keys()}
        saved = tuple(json.loads(meta["features"]))
        if saved != tuple(features):
            raise ValueError(f"{path}: the chooser reads features {list(saved)}, this suite computes {list(features)}: "
                             f"train it again")
        chooser = cls(saved, hidden=int(meta["hidden"]), votes_prior=float(meta.get("votes_prior", 0.0)))  # 0: older
        chooser.load_state_dict(weights)
        return chooser
