"""The algorithm: one optimizer step (see fixed.py's docstring for the data flow)."""

from __future__ import annotations

import torch
from torch.profiler import record_function

from engine.config import Config
from engine.distributed import Dist, gradient_sync, is_sharded, under_ddp
from loss_function import training_loss
from policy_refined import RLInfo
from training.run_state import TrainState



def train_step(state: TrainState, window: list[dict], cfg: Config, dist: Dist = Dist()) -> dict:
    """One optimizer step over a window of micro-batches (grad_accum of them, or fewer at the end);
    advances the counters. -> stats for TensorBoard (tensors until the logger writes them).

    Each micro-batch's loss is summed over its samples and divided by the window's real sample
    count over all processes, so the step's gradient is the mean gradient of exactly the samples
    it saw. A micro-batch with a non-finite loss is counted and does not go backward, except where
    every process must take part in that backward: the window's last under DDP (DDP reduces in it),
    every micro-batch under FSDP (each backward gathers the sharded weights). It then goes backward,
    the non-finite value reaches every process's gradients and every process skips the step. The
    gradients are reduced in the window's last backward (the others run without gradient sync).
    Each phase is a `record_function` range ("step/..."), free unless a profiler records it.
    """
    model, amp, counters = state.model, state.amp, state.counters
    trained = state.trained if state.trained is not None else model
    ddp, sharded = under_ddp(trained), is_sharded(trained)
    n_samples = dist.sum_int(sum(b["input"].shape[0] for b in window))
    # DDP and FSDP average over processes; the loss is a share of the global batch, so the sum is wanted
    share = dist.world_size / n_samples if ddp or sharded else 1 / n_samples
    stats: dict = {"amp/nonfinite_losses": 0.0}
    infos, rewards = [], []
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        with record_function("step/prompt"):
            batch = model.encode_prompts(batch, state.prompts, counters.micro_batches + i, training=True)
        with gradient_sync(trained, last):
            with record_function("step/forward"), amp.autocast():
                pred = trained(batch, "sampled+mean")
                loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"],
                                     cfg=cfg.loss)
                window_loss = loss.per_sample.sum() * share
            finite = bool(torch.isfinite(window_loss))
            stats["amp/nonfinite_losses"] += not finite
            if not finite and not (sharded or (ddp and last)):
                continue
            with record_function("step/backward"):
                amp.backward(window_loss)
        if not finite:
            continue
        if pred.latent_step is not None:  # how far the demos moved the prompt, and the learned step size
            loss.stats["latent/step_norm"] = pred.latent_step.detach().norm(dim=-1).mean()
            loss.stats["latent/step_lr"] = model.latent_step_size()
        for k, v in loss.stats.items():
            stats[k] = stats.get(k, 0.0) + v / len(window)
        infos.append(pred.rl)
        rewards.append(loss.reward)
    with record_function("step/optimizer"):
        result = amp.step(state.optimizer, cfg.optim.clip, watch={"qwen": model.parameter_groups()["qwen"]})
    stats["amp/stepped"] = float(result is not None and result.stepped)
    if result is not None:
        stats.update({"grad/norm": result.grad_norm, "grad/qwen_norm": result.group_norms["qwen"]})
    # The RL head learns after the main step, from detached tensors, with its own optimizer.
    if dist.sum_int(bool(infos)) == dist.world_size:
        info = RLInfo(torch.cat([x.head_input for x in infos]), torch.cat([x.action for x in infos]))
        with record_function("step/rl"):
            stats.update(model.rl_update(info, torch.cat(rewards), state.rl_optimizer, dist, state.rl_head))
    counters.optimizer_steps += 1
    counters.micro_batches += len(window)
    counters.micro_batches_in_epoch += len(window)
    counters.consecutive_skips = 0 if stats["amp/stepped"] else counters.consecutive_skips + 1
    return stats
