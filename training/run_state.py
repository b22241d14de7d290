"""Everything a run carries between steps, and how it goes into a checkpoint and back.

Shared weights are written once; what differs per process (RNG states, the RL noise generator, the
prompt cache) is gathered from every rank, so a resumed run continues exactly on each of them.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.checkpoint import (
    MODEL_FILE,
    SHARDED_DIR,
    checkpoint_flags,
    commit_checkpoint,
    is_sharded_checkpoint,
    is_weights_only,
    load_checkpoint,
    load_state,
    rng_state,
    set_rng_state,
    staging_folder,
    start_checkpoint,
    weights_only_steps,
)
from engine.config import NOT_RESUMED, RESUME_FREE, SECTION_OF, Config, changed_flags
from engine.distributed import Dist, is_sharded, weights_checksum
from engine.errors import ConfigError
from engine.precision import MixedPrecision
from engine.sharded import restore_shards, save_shards, shard_whole_state
from model import ArcModel
from prompt import PromptCache, QwenFeatures


@dataclass
class Counters:
    """Two counts named apart: optimizer steps are what users see (TensorBoard x-axis, --log_every,
    --save_every, checkpoint names); micro-batches drive --prompt_refresh and the epoch's position."""

    optimizer_steps: int = 0
    micro_batches: int = 0
    epoch: int = 0
    micro_batches_in_epoch: int = 0
    consecutive_skips: int = 0  # optimizer steps in a row skipped for non-finite loss or gradients
    # training time over every invocation of the run (validation not counted): what the held-out
    # loss's curve is drawn against (heldout/train_minutes); a checkpoint written before it holds 0
    train_seconds: float = 0.0
    # of it, torch.compile's seconds (agents.compile_seconds, each invocation's added): the lr schedule's
    # clock leaves them out, so a resumed run's schedule continues where it stopped
    compile_seconds: float = 0.0


@dataclass(kw_only=True)
class TrainState:
    model: ArcModel
    prompts: QwenFeatures | None  # the prompt cache (None without a Qwen stream)
    optimizer: torch.optim.Optimizer  # main: prompt heads, refiner, agent, trainable Qwen
    rl_optimizer: torch.optim.Optimizer  # the RL head only
    amp: MixedPrecision
    counters: Counters = field(default_factory=Counters)
    # What a training step calls: the model and the RL head, each under DDP with several processes
    # (engine/distributed.py: data_parallel); the model itself and its head otherwise.
    trained: torch.nn.Module | None = None
    rl_head: torch.nn.Module | None = None
    # Whether the model holds FSDP2 units (engine/distributed.is_sharded, a walk of every module: read
    # once at build, not in every step)
    sharded: bool = False


def _rank_state(state: TrainState) -> dict:
    cache = state.prompts if isinstance(state.prompts, PromptCache) else None
    if cache is not None:
        cache.flush()
    checksum = None if is_sharded(state.model) else weights_checksum(state.model)  # shards differ by design
    return {"rng": rng_state(), "rl_noise": state.model.rl_noise_state(), "checksum": checksum,
            "prompt_cache": cache.state_dict() if cache is not None else None}


def save_run_state(state: TrainState, config: dict, run_dir: Path, keep: int, dist: Dist) -> None:
    """Collective: every rank calls it. Unsharded, the main one writes checkpoint `optimizer_steps`;
    sharded (--fsdp), every one writes its shards of the weights and of the main optimizer with
    torch.distributed.checkpoint, and the main one writes the rest."""
    ranks = dist.gather(_rank_state(state))
    step = state.counters.optimizer_steps
    checksums = [r["checksum"] for r in ranks]
    if len(set(checksums)) > 1:  # a bug, never a user error: the processes must hold one model
        raise RuntimeError(f"processes hold different weights at step {step}: {checksums}")
    sharded = is_sharded(state.model)
    if dist.is_main:
        start_checkpoint(run_dir, step)
    if sharded:
        dist.barrier()  # the staging folder exists
        save_shards(state.model, state.optimizer, staging_folder(run_dir, step) / SHARDED_DIR)
    if dist.is_main:
        saved = {"counters": dataclasses.asdict(state.counters), "config": config, "world_size": dist.world_size,
                 "rl_optimizer": state.rl_optimizer.state_dict(), "amp": state.amp.state_dict(), "ranks": ranks}
        if not sharded:
            saved["optimizer"] = state.optimizer.state_dict()
        commit_checkpoint(run_dir, step, None if sharded else state.model.trainable_state(), saved, keep)
    dist.barrier()


def restore_weights(model: ArcModel, folder: Path) -> None:
    """Load a checked unsharded checkpoint's weights into an unsharded `model`."""
    try:
        model.load_trainable_state(load_file(str(folder / MODEL_FILE)))
    except ConfigError as err:
        raise ConfigError(f"--resume {folder}: {err}") from None


def _restore_model_and_optimizer(state: TrainState, folder: Path) -> dict:
    """Weights and main optimizer from either checkpoint format into a sharded or unsharded model.
    -> state.pt's contents."""
    if is_sharded_checkpoint(folder):
        try:
            restore_shards(state.model, state.optimizer, folder / SHARDED_DIR)
        except ConfigError as err:
            raise ConfigError(f"--resume {err}") from None
        return load_state(folder)
    if not is_sharded(state.model):
        restore_weights(state.model, folder)
        saved = load_state(folder)
        state.optimizer.load_state_dict(saved["optimizer"])
        return saved
    # an unsharded checkpoint into sharded weights: whole tensors in, each process keeps its shards
    weights, saved = load_checkpoint(folder)
    try:
        state.model.check_fits(weights)
    except ConfigError as err:
        raise ConfigError(f"--resume {folder}: {err}") from None
    shard_whole_state(state.model, state.optimizer, weights, saved["optimizer"])
    return saved


def say_run_flags(folder: Path, config: dict, dist: Dist) -> None:
    """One line (the main process, once the run folder is claimed): the flags this run shares with the
    checkpoint's run that are off today's defaults, so a recipe's budget or validation that a resume took
    along (training/cli.run_flags_of) is read, not guessed."""
    saved, defaults = checkpoint_flags(folder), Config().flags()
    kept = [f"{k}={v}" for k, v in sorted(config.items())
            if k in saved and k not in NOT_RESUMED and saved[k] == v != defaults[k]]
    if kept and dist.is_main:
        print(f"--resume: the run's own flags off the defaults: {' '.join(kept)}", file=sys.stderr)
    if saved.get("submission") and not config["submission"] and dist.is_main:
        print(f"--resume: the run wrote its submission to {saved['submission']}; not this time (a file outside the "
              f"run folder, which a checkpoint may not choose): give --submission to write one", file=sys.stderr)


def restore_run_state(state: TrainState, folder: Path, config: dict, dist: Dist, *, evaluating: bool = False) -> None:
    """Everything of a checkpoint back in place: weights, optimizers, scaler, RNG and counters.
    `evaluating`: nothing will train on, so the optimizer section (how the weights were trained; its
    --amp is the precision evaluation runs in, chosen on purpose) may differ without a warning."""
    say_run_flags(folder, config, dist)
    if is_weights_only(folder):  # a bundle's: the weights to evaluate, nothing to train on from
        if not evaluating or is_sharded(state.model):
            raise ConfigError(f"--resume {folder}: a weights-only checkpoint (a bundle's) is for --eval_only "
                              f"without --fsdp: it holds no optimizer state to train on")
        restore_weights(state.model, folder)
        state.counters = Counters(optimizer_steps=weights_only_steps(folder))
        return
    saved = _restore_model_and_optimizer(state, folder)
    state.rl_optimizer.load_state_dict(saved["rl_optimizer"])
    state.amp.load_state_dict(saved["amp"])
    ranks = saved["ranks"]
    if len(ranks) != dist.world_size and dist.is_main:
        print(f"warning: checkpoint written by {len(ranks)} processes, resuming with {dist.world_size}: "
              f"random streams will not continue exactly", file=sys.stderr)
    mine = ranks[dist.rank % len(ranks)]
    state.model.set_rl_noise_state(mine["rl_noise"])
    if isinstance(state.prompts, PromptCache) and mine["prompt_cache"] is not None:
        state.prompts.load_state_dict(mine["prompt_cache"])
    set_rng_state(mine["rng"])
    # an evaluation trains nothing: its optimizer flags cannot change what it scores
    free = RESUME_FREE | frozenset(k for k, s in SECTION_OF.items() if evaluating and s == "optim")
    changed = [f"{k} {v} (the checkpoint's: {theirs})" for k, theirs, v in changed_flags(saved["config"], config, free)]
    if changed and dist.is_main:
        print(f"warning: resuming with a different config: {', '.join(changed)}", file=sys.stderr)
    state.counters = Counters(**saved["counters"])
