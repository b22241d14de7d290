"""The algorithm: one optimizer step (the data flow: README.md, "How it works")."""

from __future__ import annotations

import torch
from torch.profiler import record_function

from engine.config import Config
from engine.distributed import Dist, gradient_sync, under_ddp
from loss_function import training_loss
from policy_refined import RLInfo
from training.run_state import TrainState


def train_step(state: TrainState, window: list[dict], cfg: Config, dist: Dist = Dist()) -> dict:
    """One optimizer step over a window of micro-batches (grad_accum of them, or fewer at the end):
    the window's gradient (`_window_gradient`), the step (engine/precision.py: unscale, clip, step,
    or a skip on non-finite gradients), then the RL head's own update on detached tensors; advances
    the counters. -> stats for TensorBoard (tensors until the logger writes them). Each phase is a
    `record_function` range ("step/..."), free unless a profiler records it."""
    model, counters = state.model, state.counters
    stats, infos, rewards = _window_gradient(state, window, cfg, dist)
    with record_function("step/optimizer"):
        result = state.amp.step(state.optimizer, cfg.optim.clip, watch={"qwen": _group(state.optimizer, "qwen")})
    stats["amp/stepped"] = float(result is not None and result.stepped)
    if result is not None:
        stats.update({"grad/norm": result.grad_norm, "grad/qwen_norm": result.group_norms["qwen"]})
    # The RL head learns after the main step, from detached tensors, with its own optimizer; also
    # when the main step was skipped for non-finite gradients (an fp16 overflow, a poisoned weight's
    # gradient): its inputs and rewards come from the window's finite micro-batches only, and the
    # main gradients are not its (tests/test_loop_faults.py).
    if infos:
        info = RLInfo(torch.cat([x.head_input for x in infos]), torch.cat([x.action for x in infos]))
        with record_function("step/rl"):
            stats.update(model.rl_update(info, torch.cat(rewards), state.rl_optimizer, dist, state.rl_head))
    counters.optimizer_steps += 1
    counters.micro_batches += len(window)
    counters.micro_batches_in_epoch += len(window)
    counters.consecutive_skips = 0 if stats["amp/stepped"] else counters.consecutive_skips + 1
    return stats


def _window_gradient(state: TrainState, window: list[dict], cfg: Config,
                     dist: Dist) -> tuple[dict, list[RLInfo], list[torch.Tensor]]:
    """Forward and backward over the window's micro-batches, into the main optimizer's gradients: the
    mean gradient of exactly the samples that went backward, over all processes; a non-finite loss
    goes backward only where every process must join that backward (DDP: the window's last; FSDP:
    every one), so every process skips the step (docs/invariants.md #2, #3). -> (loss stats averaged
    over the micro-batches that went backward, with the count of non-finite losses; their RL head
    inputs and actions and their rewards [B] each, both empty unless every process has some)."""
    model, amp = state.model, state.amp
    trained = state.trained if state.trained is not None else model
    ddp, sharded = under_ddp(trained), state.sharded
    n_samples = dist.sum_int(sum(b["input"].shape[0] for b in window))
    # DDP and FSDP average over processes; the loss is a share of the global batch, so the sum is wanted
    share = dist.world_size / n_samples if ddp or sharded else 1 / n_samples
    learned, infos, rewards = [], [], []
    dropped = 0  # samples of this process whose loss was non-finite
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        with record_function("step/prompt"):
            batch = model.encode_prompts(batch, state.prompts, state.counters.micro_batches + i, training=True)
        with gradient_sync(trained, last):
            with record_function("step/forward"), amp.autocast():
                pred = trained(batch, "sampled+mean")  # pred.names: ("sampled", "mean"), training_loss's order
                loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"],
                                     cfg=cfg.loss)
                window_loss = loss.per_sample.sum() * share
            finite = bool(torch.isfinite(window_loss))
            dropped += 0 if finite else batch["input"].shape[0]
            if not finite and not (sharded or (ddp and last)):
                continue
            with record_function("step/backward"):
                amp.backward(window_loss)
        if not finite:
            continue
        learned.append(loss.stats)
        infos.append(pred.rl)
        rewards.append(loss.reward)
    # one collective for both: the samples dropped everywhere, and whether every process learned
    all_dropped, learning = dist.sum_ints(dropped, int(bool(learned)))
    kept = n_samples - all_dropped
    if 0 < kept < n_samples:
        _rescale_gradients(state.optimizer, n_samples / kept)
    if learning < dist.world_size:  # the RL head's update is a collective: every process or none
        infos, rewards = [], []
    stats = {k: sum(s[k] for s in learned) / len(learned) for k in learned[0]} if learned else {}
    return {"amp/nonfinite_losses": float(len(window) - len(learned)), **stats}, infos, rewards


def _group(optimizer: torch.optim.Optimizer, name: str) -> list[torch.nn.Parameter]:
    """The parameters of the optimizer's group of this name (training/build.py names them); none
    without one (a frozen Qwen has no group)."""
    return next((g["params"] for g in optimizer.param_groups if g.get("name") == name), [])


@torch.no_grad()
def _rescale_gradients(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Multiply every gradient the optimizer holds by `factor` (sharded ones shard by shard)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(factor)
