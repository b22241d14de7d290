"""The EFE (expected free energy) loss with hard-cell weighting, the training loss, and the
loss per-task adaptation descends (the EFE of its one prediction).

Pure functions. Per valid cell, with q = softmax(logits) and C classes:

    risk       = -sum_c pref(c) log q(c)        pref = (1 - label_smoothing) onehot + label_smoothing / C
    divergence = KL(q || p_eps) = sum_c q(c) (log q(c) - log p_eps(c))
                                                p_eps = (1 - kl_eps) onehot + kl_eps / C  (finite for one-hot)
    ambiguity  = H[q] = -sum_c q(c) log q(c)
    cell_loss  = risk + lambda_r * divergence + lambda_a * ambiguity

Hard cells (predicted wrong, or output differs from input) weigh `hard_weight`, others 1. Per sample:

    efe = (0.5 + 0.5 * mask_ratio) * sum(weight * cell_loss) / n_valid + lambda_c * ||refined - prompt||^2

where mask_ratio is the share of valid cells still predicted wrong (no gradient). Everything is per
sample, so a batch split into micro-batches gives the same gradient as the whole batch. Every
coefficient is a flag of the same name (engine.config.LossCfg).

Each sample weighs the same, whatever its grid's size: its cells are averaged (`/ n_valid`), and the
training step averages samples. ARC scores an episode by its whole grid, exact or not, so each
episode gets one vote, as TRM and HRM normalise their loss per sequence; a mean over every cell of
the batch would let one 30x30 grid (900 cells) outweigh a hundred 3x3 ones, and the many small
tasks, the ones a rule is easiest to read from, would barely move the weights. The price: a cell of
a small grid moves the weights more than a cell of a large one (tests/test_loss_function.py pins
this). The per-sample loss is large early in a run (18.6 at the default recipe's third step,
tests/test_recipe.py) for another reason: an agent confidently wrong on nearly every cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.canvas import PAD, one_hot
from engine.config import LossCfg


@dataclass(frozen=True)
class EFEResult:
    """Per sample, for every prediction of it (the leading [..., B] of the logits)."""

    per_sample: torch.Tensor  # [..., B] float32, carries gradients
    mask_ratio: torch.Tensor  # [..., B] float32, detached
    log_likelihood: torch.Tensor  # [..., B] float32, detached: the target's mean log q over valid cells
    # [..., B] float32 each, detached: risk, divergence and ambiguity (their cell means), complexity
    parts: dict[str, torch.Tensor]


def valid_cells(input_canvas: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[B, H, W] bool: cells inside the input or the target grid (incl. EOG markers); PAD cells
    outside both are excluded from the loss."""
    return (target != PAD) | (input_canvas != PAD)


def _cell_mean(x: torch.Tensor, validf: torch.Tensor, n_valid: torch.Tensor) -> torch.Tensor:
    """x [..., B, H, W] -> [..., B]: its mean over each sample's valid cells (validf [B, H, W]
    float32, n_valid [B] their count, at least 1)."""
    return (x * validf).sum((-2, -1)) / n_valid


def _target_log_q(log_q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """log_q [..., B, H, W, C], target [B, H, W] int64 -> [..., B, H, W]: log q of the target class."""
    return log_q.gather(-1, target.unsqueeze(-1).expand(*log_q.shape[:-1], 1)).squeeze(-1)


def efe_loss(logits: torch.Tensor, target: torch.Tensor, input_canvas: torch.Tensor,
             refined_prompt: torch.Tensor, prompt: torch.Tensor, *, cfg: LossCfg = LossCfg()) -> EFEResult:
    """EFE loss per sample, of one prediction per sample or of several ([K, B, ...]: training's
    sampled and mean refinements, in one pass over the cells and one backward).

    Args:
        logits: [..., B, S, S, C] float (any float dtype; the loss is computed in float32).
        target: [B, S, S] int64 class indices. A float target is an error: it used to be passed
            as `out.float()` and silently broadcast inside the KL term.
        input_canvas: [B, S, S] int64, the query input (for the valid mask and hard cells).
        refined_prompt: [..., B, P] float32, after refinement; prompt: [B, P] float32, before.
        cfg: the coefficients (label_smoothing, kl_eps, lambda_r, lambda_a, lambda_c, hard_weight).
    Returns:
        EFEResult with per_sample [..., B] float32 (with gradients), and detached mask_ratio,
        log_likelihood and parts [..., B].
    """
    if target.dtype != torch.long:
        raise TypeError(f"efe_loss: target must hold integer class indices (torch.long), got {target.dtype}")
    if logits.shape[-4:-1] != target.shape:
        raise ValueError(f"efe_loss: logits {tuple(logits.shape)} do not match target {tuple(target.shape)}")
    num_classes = logits.shape[-1]
    # float32 on purpose: log-softmax and KL of bf16/fp16 logits under autocast lose the small terms.
    log_q = F.log_softmax(logits.float(), dim=-1)
    q = log_q.exp()
    onehot = one_hot(target, num_classes)  # [B, S, S, C]: shared by every prediction of a sample

    pref = (1 - cfg.label_smoothing) * onehot + cfg.label_smoothing / num_classes
    risk = -(pref * log_q).sum(-1)
    log_p_eps = torch.log((1 - cfg.kl_eps) * onehot + cfg.kl_eps / num_classes)
    divergence = (q * (log_q - log_p_eps)).sum(-1)
    ambiguity = -(q * log_q).sum(-1)
    cell_loss = risk + cfg.lambda_r * divergence + cfg.lambda_a * ambiguity

    valid = valid_cells(input_canvas, target)
    validf = valid.float()
    n_valid = validf.sum((-2, -1)).clamp_min(1.0)
    with torch.no_grad():
        wrong = (log_q.argmax(-1) != target) & valid
        hard = wrong | (target != input_canvas)
        weight = torch.where(hard, cfg.hard_weight, 1.0) * validf
        mask_ratio = wrong.float().sum((-2, -1)) / n_valid
        log_likelihood = _cell_mean(_target_log_q(log_q, target), validf, n_valid)

    data_term = (weight * cell_loss).sum((-2, -1)) / n_valid
    complexity = (refined_prompt.float() - prompt.float()).pow(2).sum(-1)
    per_sample = (0.5 + 0.5 * mask_ratio) * data_term + cfg.lambda_c * complexity

    with torch.no_grad():
        parts = {"risk": _cell_mean(risk, validf, n_valid), "divergence": _cell_mean(divergence, validf, n_valid),
                 "ambiguity": _cell_mean(ambiguity, validf, n_valid), "complexity": complexity}
    return EFEResult(per_sample, mask_ratio, log_likelihood, {k: v.detach() for k, v in parts.items()})


def adaptation_loss(logits: torch.Tensor, refined: torch.Tensor, prompt: torch.Tensor, target: torch.Tensor,
                    input_canvas: torch.Tensor, *, cfg: LossCfg) -> torch.Tensor:
    """What per-task adaptation descends (docs/adaptation.md): the EFE of its one prediction (the mean
    refinement) with the training loss's coefficients, unweighted: Adam does not see a constant weight.
    logits [B, S, S, C] float; refined, prompt [B, P]; target, input_canvas [B, S, S] int64.
    -> [B] float32 with gradients."""
    return efe_loss(logits, target, input_canvas, refined, prompt, cfg=cfg).per_sample


@dataclass(frozen=True)
class TrainingLoss:
    per_sample: torch.Tensor  # [B] float32, carries gradients: the combined loss
    reward: torch.Tensor  # [B] float32, no gradient: the RL head's reward
    stats: dict[str, torch.Tensor]  # batch means, detached, for logging


def training_loss(logits: torch.Tensor, refined: torch.Tensor, prompt: torch.Tensor, target: torch.Tensor,
                  input_canvas: torch.Tensor, *, cfg: LossCfg) -> TrainingLoss:
    """The loss of one training micro-batch and the RL reward, from the predictions made with the
    sampled and with the mean refinement (both in one `efe_loss`): per sample, `efe_weight * EFE(sampled)
    + mean_weight * EFE(mean)`.

    Args:
        logits: [2, B, S, S, C] float, sampled first, then mean. refined: [2, B, P] in that order.
        prompt: [B, P], before refinement. target, input_canvas: [B, S, S] int64.
    The reward is `reward_scale * (loglik(sampled) - loglik(mean))` of the target, signed: positive
    where the sampled delta explained the target better than the mean one. The logged parts are
    the sampled refinement's.
    """
    efe = efe_loss(logits, target, input_canvas, refined, prompt, cfg=cfg)
    efe_sampled, efe_mean = efe.per_sample
    loss = cfg.efe_weight * efe_sampled + cfg.mean_weight * efe_mean  # both terms carry gradients
    reward = cfg.reward_scale * (efe.log_likelihood[0] - efe.log_likelihood[1])
    stats = {"loss/combined": loss.detach().mean(), "loss/efe": efe_sampled.detach().mean(),
             "loss/efe_mean": efe_mean.detach().mean(), "train/mask_ratio": efe.mask_ratio[0].mean(),
             "rl/reward": reward.mean(), **{f"loss/{k}": v[0].mean() for k, v in efe.parts.items()}}
    return TrainingLoss(loss, reward, stats)
