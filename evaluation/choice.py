"""The learned attempt chooser (`--attempt_ranking learned`): what it reads of one test input's
candidates, the policy over them, and the two attempts it picks.

Every candidate is described by FEATURES, from its votes and log-probabilities under the views and
from the task's demos and test input (never a test output): `AttemptChooser` scores these rows and
takes its two best. It is an experiment kept out of the defaults (docs/options.md): trained by
`--train_chooser` (training/chooser.py), read only where a validation asks for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from data.arc import ArcPair, Grid
from evaluation.scoring import Candidates

FLOOR = -20.0  # nats a view: where a log-probability feature stops (a view that cannot hold the grid gives -inf)
FEATURES = (
    "vote_share",  # votes / views (0 for a proposed grid)
    "votes_rank",  # 1 / (1 + rank under the votes' ranking)
    "logprob_gap",  # (view-summed log-probability - the best candidate's) / views, >= FLOOR
    "logprob_rank",  # 1 / (1 + rank under the summed log-probability)
    "cell_logprob",  # view-summed log-probability / (views x cells), >= FLOOR
    "proposed",  # 1: no view predicted it (enumerated, Candidates.propose_likely)
    "shape_follows",  # 1: its shape follows the demos' output shapes (same as the input, one fixed shape or a
    #                   fixed ratio to the input), 0: it breaks the rule they follow, 0.5: they follow none
    "colours_known",  # share of its cells in colours of the test input or of a demo output
    "is_input",  # 1: it copies the test input
    "differs_from_first",  # share of its cells that differ from the votes' first (1 when the shapes differ)
    "candidates",  # log(1 + number of candidates)
)


def expected_shapes(demos: tuple[ArcPair, ...], query: Grid) -> set[tuple[int, int]] | None:
    """Output shapes the demos' pattern allows for `query`: the input's shape when every demo keeps
    it, the one shape every demo output has, the input's shape times the demos' fixed ratio; None
    when the demos follow none of these."""
    shapes: set[tuple[int, int]] = set()
    ins, outs = [p.input.shape for p in demos], [p.output.shape for p in demos]
    if all(i == o for i, o in zip(ins, outs, strict=True)):
        shapes.add(query.shape)
    if len(set(outs)) == 1:
        shapes.add(outs[0])
    ratios = {(o[0] / i[0], o[1] / i[1]) for i, o in zip(ins, outs, strict=True)}
    if len(ratios) == 1:
        (ry, rx), = ratios
        h, w = query.shape[0] * ry, query.shape[1] * rx
        if h.is_integer() and w.is_integer():
            shapes.add((int(h), int(w)))
    return shapes or None


def candidate_features(cands: Candidates, demos: tuple[ArcPair, ...], query: Grid) -> tuple[list[Grid], np.ndarray]:
    """-> (the candidates in the votes' order, their features [N, len(FEATURES)] float32).

    demos: the task's demo pairs; query: the test input [h, w] int64. Reads no test output."""
    grids = cands.ranked("votes")
    views = max(len(cands.views), 1)
    by_key = cands.view_scores()
    scores = np.array([by_key[Candidates.key(g)] for g in grids])
    by_logprob = {Candidates.key(g): r for r, g in enumerate(cands.ranked("logprob"))}
    shapes = expected_shapes(demos, query)
    known = np.zeros(10, bool)
    for grid in (query, *(p.output for p in demos)):
        known[np.unique(grid)] = True
    first = grids[0]
    rows = []
    for rank, (grid, score) in enumerate(zip(grids, scores, strict=True)):
        key = Candidates.key(grid)
        gap = (score - scores.max()) / views if np.isfinite(score) else FLOOR
        rows.append([
            cands.votes.get(key, 0) / views,
            1 / (1 + rank),
            max(gap, FLOOR),
            1 / (1 + by_logprob[key]),
            max(score / (views * grid.size), FLOOR) if np.isfinite(score) else FLOOR,
            float(key in cands.proposed),
            0.5 if shapes is None else float(grid.shape in shapes),
            float(known[grid].mean()),
            float(grid.shape == query.shape and (grid == query).all()),
            float((grid != first).mean()) if grid.shape == first.shape else 1.0,
            float(np.log1p(len(grids))),
        ])
    return grids, np.asarray(rows, dtype=np.float32)


def learned_attempts(chooser, cands: Candidates, demos: tuple[ArcPair, ...], query: Grid) -> tuple[Grid, Grid]:
    """The two candidates `chooser` (an AttemptChooser) scores best, the better first."""
    grids, features = candidate_features(cands, demos, query)
    first, second = chooser.best_two(features)
    return grids[first], grids[second]


def plackett_luce_two(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Two draws without replacement from softmax(logits) of each row, the second from what the first
    left (Plackett-Luce), by the Gumbel top-2 trick. logits [B, N] float32 (-inf: not a candidate) ->
    indices [B, min(2, N)] int64; a row with one candidate gives a -inf one second."""
    u = torch.rand(logits.shape, generator=generator).clamp(1e-12, 1 - 1e-7)
    return (logits - torch.log(-torch.log(u))).topk(min(2, logits.shape[-1]), dim=-1).indices


class AttemptChooser(nn.Module):
    """The RL head's test-time job: a policy over one test input's candidates that picks the two attempts.

    A small MLP scores each candidate's FEATURES row ([N, F] float32); the policy is their softmax, the two
    attempts drawn without replacement (Plackett-Luce), at test time the two best. `update`: REINFORCE with the
    exact-match reward and a moving-average baseline (training/chooser.py). `features` names its inputs, so a
    chooser is never read against other features."""

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
