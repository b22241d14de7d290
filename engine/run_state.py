"""Everything a run carries between steps, and how it goes into a checkpoint and back.

Shared weights are written once; what differs per process (RNG states, the RL noise generator, the
prompt cache) is gathered from every rank, so a resumed run continues exactly on each of them.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from engine.config import ConfigError
from engine.distributed import Dist
from engine.precision import MixedPrecision

# Flags that may change on resume without a warning: they do not change what is learned.
RESUME_FREE = {"resume", "epochs", "max_batches", "max_minutes", "run_dir", "num_workers", "log_every", "save_every", "eval_tasks",
               "eval_batch_size", "keep_checkpoints", "max_consecutive_skips", "prompt_cache_dir"}


@dataclass
class Parts:
    prompt: torch.nn.Module  # QwenHybridPrompt
    agent: torch.nn.Module
    policy: object  # PolicyRefiner: refiner + RL head with its own optimizer
    optimizer: torch.optim.Optimizer
    amp: MixedPrecision

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"prompt": self.prompt, "agent": self.agent, "refiner": self.policy.refiner,
                "rl_head": self.policy.head}

    def train(self, mode: bool = True) -> None:
        for m in self.modules().values():
            m.train(mode)


@dataclass
class Counters:
    step: int = 0  # optimizer steps taken
    batch: int = 0  # micro-batches consumed (drives the prompt refresh)
    epoch: int = 0
    batch_in_epoch: int = 0
    consecutive_skips: int = 0


def plan_run_dir(run_dir: str, run_name: str, seed: int, resumed_from: Path | None) -> Path:
    """The run folder (not created yet: nothing is written before every input has been checked)."""
    if run_dir:
        path = Path(run_dir)
        if resumed_from is None and (path / "checkpoints").exists():
            raise ConfigError(f"--run_dir {path} already holds a run: pass --resume {path} to continue it, "
                              f"or choose another --run_dir")
        return path
    if resumed_from is not None:
        return resumed_from.parent.parent
    return Path("runs") / f"{run_name}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def trainable_weights(parts: Parts) -> dict[str, torch.Tensor]:
    """Everything training changes; a frozen Qwen trunk is reloaded from its source instead."""
    weights = {}
    for name, module in parts.modules().items():
        frozen = {n for n, p in module.named_parameters() if n.startswith("qwen.") and not p.requires_grad}
        weights.update({f"{name}.{k}": v for k, v in module.state_dict().items() if k not in frozen})
    return weights


def load_weights(parts: Parts, weights: dict[str, torch.Tensor]) -> None:
    for name, module in parts.modules().items():
        mine = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".")}
        missing, unexpected = module.load_state_dict(mine, strict=False)
        frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
        if unexpected or set(missing) - frozen:
            raise ConfigError(f"--resume: checkpoint does not fit the model ({name}: missing "
                              f"{sorted(set(missing) - frozen)[:3]}, unexpected {unexpected[:3]})")


def weights_checksum(parts: Parts) -> float:
    """A cheap fingerprint of every trainable weight (float64 sums), to compare processes."""
    with torch.no_grad():
        return float(sum(v.double().sum() * (i + 1) for i, v in enumerate(trainable_weights(parts).values())
                         if v.is_floating_point()))


def _rank_state(parts: Parts) -> dict:
    cache = parts.prompt.cache
    if cache is not None:
        cache.flush()
    return {"rng": rng_state(), "policy": parts.policy.state_dict(), "checksum": weights_checksum(parts),
            "prompt_cache": cache.state_dict() if cache is not None else None}


def save_run_state(parts: Parts, counters: Counters, config: dict, run_dir: Path, keep: int, dist: Dist) -> None:
    """Collective: every rank calls it; the main one writes."""
    ranks = dist.gather(_rank_state(parts))
    checksums = [r["checksum"] for r in ranks]
    if len(set(checksums)) > 1:  # a bug, never a user error: the processes must hold one model
        raise RuntimeError(f"processes hold different weights at step {counters.step}: checksums {checksums}")
    if dist.is_main:
        state = {"counters": dataclasses.asdict(counters), "config": config, "world_size": dist.world_size,
                 "optimizer": parts.optimizer.state_dict(), "amp": parts.amp.state_dict(), "ranks": ranks}
        save_checkpoint(run_dir, counters.step, trainable_weights(parts), state, keep)
    dist.barrier()


def restore_run_state(parts: Parts, folder: Path, config: dict, dist: Dist) -> Counters:
    weights, state = load_checkpoint(folder)
    load_weights(parts, weights)
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.amp.load_state_dict(state["amp"])
    ranks = state["ranks"]
    if len(ranks) != dist.world_size and dist.is_main:
        print(f"warning: checkpoint written by {len(ranks)} processes, resuming with {dist.world_size}: "
              f"random streams will not continue exactly", file=sys.stderr)
    mine = ranks[dist.rank % len(ranks)]
    parts.policy.load_state_dict(mine["policy"])
    if parts.prompt.cache is not None and mine["prompt_cache"] is not None:
        parts.prompt.cache.load_state_dict(mine["prompt_cache"])
    set_rng_state(mine["rng"])
    changed = [k for k, v in config.items() if k not in RESUME_FREE and state["config"].get(k) != v]
    if changed and dist.is_main:
        print(f"warning: resuming with a different config: {', '.join(changed)}", file=sys.stderr)
    return Counters(**state["counters"])
