"""Several processes (`torchrun` or `accelerate launch`): one process per device, gradients
averaged by all-reduce before every optimizer step.

Gradients are reduced by hand rather than by DDP: Qwen has gradients only on refresh steps and a
skipped micro-batch has none at all, and "no gradient" must stay None on every rank (a zero
gradient would still move AdamW's moments and weight decay). So a mask of which parameters have a
gradient on any rank is reduced first, then exactly those gradients (None counting as zero).
Every rank ends a step with identical gradients, so identical weights, scaler and RL head.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum_int(self, value: int) -> int:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t.item())

    def any(self, flag: bool) -> bool:
        return self.sum_int(int(flag)) > 0

    def average_gradients(self, params: list[torch.nn.Parameter], denominator: int | None = None) -> None:
        """Sum (or average over `denominator`) the gradients of `params` across ranks, in place."""
        if not self.active:
            return
        device = params[0].device
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        dist.all_reduce(has)
        for p, any_rank in zip(params, has.tolist()):
            if not any_rank:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            if denominator:
                p.grad.div_(denominator)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return value
        out = value.detach().clone()
        dist.all_reduce(out)
        return out / self.world_size

    def gather(self, obj: object) -> list:
        """Every rank's `obj`, on every rank, in rank order."""
        if not self.active:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def init_distributed(device_choice: str) -> tuple[Dist, torch.device]:
    """Reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK); gloo without CUDA, NCCL with."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if world <= 1:
        return Dist(), torch.device("cuda" if use_cuda else "cpu")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local_rank), torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
