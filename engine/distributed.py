"""Several processes (`torchrun` or `accelerate launch`): one process per device (docs/distributed.md).

Gradients are averaged by torch's DistributedDataParallel (`data_parallel`, `gradient_sync`), or by
FSDP2 with `--fsdp` (engine/fsdp.py; `gradient_sync` and `is_sharded` speak for both). DDP reduces
from hooks inside backward, so every process takes part in a window's last backward. `Dist`
carries the loop's small control collectives and the gathering of validation results.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from engine.errors import ConfigError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def _reduced(self, values, dtype: torch.dtype, op=dist.ReduceOp.SUM) -> list:
        """Each value reduced by `op` over the processes, in one collective."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=dtype)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum_int(self, value: int) -> int:
        return self.sum_ints(value)[0]

    def sum_ints(self, *values: int) -> tuple[int, ...]:
        return tuple(self._reduced(values, torch.int64))

    def max_int(self, value: int) -> int:
        return self._reduced([value], torch.int64, dist.ReduceOp.MAX)[0]

    def any(self, flag: bool) -> bool:
        return self.sum_int(int(flag)) > 0

    def sum_floats(self, values: list[float]) -> list[float]:
        """Each value summed over every rank (float64), in one collective."""
        return self._reduced(values, torch.float64)

    def from_main(self, value: float) -> float:
        """Rank 0's value on every rank: one clock, so every rank takes the same time-based branch."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(t, src=0)
        return float(t.item())

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


def weights_checksum(model: nn.Module) -> float:
    """A cheap fingerprint of every trainable weight of an ArcModel (float64 sums), to compare processes."""
    with torch.no_grad():
        return float(sum(v.double().sum() * (i + 1) for i, v in enumerate(model.trainable_state().values())
                         if v.is_floating_point()))


def data_parallel(module: nn.Module, dist_: Dist, device: torch.device, *, bucket_mb: float,
                  ignore: tuple[str, ...] = (), find_unused: bool = False) -> nn.Module:
    """`module` under torch's DistributedDataParallel with several processes (itself otherwise), in
    buckets of `bucket_mb` MiB; `ignore`: names of parameters trained elsewhere; `find_unused`: a
    trainable Qwen outside its refresh steps (docs/distributed.md). Buffers are left alone too: each is
    a constant or updated identically on every process (the RL baseline), so broadcasting them at
    every forward would only cost a collective."""
    if not dist_.active:
        return module
    buffers = [name for name, _ in module.named_buffers()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, [*ignore, *buffers])
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                   bucket_cap_mb=bucket_mb, find_unused_parameters=find_unused)


def under_ddp(module: nn.Module) -> bool:
    return isinstance(module, DistributedDataParallel)


def is_sharded(module: nn.Module) -> bool:
    """Whether `module` holds FSDP2 units (engine/fsdp.py)."""
    return any(isinstance(m, FSDPModule) for m in module.modules())


@contextlib.contextmanager
def gradient_sync(module: nn.Module, sync: bool):
    """DDP's `no_sync`, or FSDP2's `set_requires_gradient_sync(False)` on each unit, unless `sync`:
    micro-batches before a window's last accumulate locally, so one reduction serves the whole
    window. A no-op for a module neither under DDP nor sharded."""
    if sync:
        yield
    elif under_ddp(module):
        with module.no_sync():
            yield
    else:
        units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_requires_gradient_sync(True, recurse=False)


def launcher_wants_fsdp() -> bool:
    """`accelerate launch` with an FSDP config (configs/accelerate/*-fsdp.yaml) asks for --fsdp.
    The units and precision are fixed.py's own (engine/fsdp.py); only FSDP2 is accepted."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return False
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise ConfigError(f"accelerate config: fsdp_version {os.environ.get('FSDP_VERSION', '1')}: fixed.py shards "
                          f"with FSDP2, set fsdp_version: 2")
    return True


def init_distributed(device_choice: str, fsdp: bool = False) -> tuple[Dist, torch.device]:
    """Reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK); gloo without CUDA, NCCL with.
    `fsdp` with one process still makes a process group (of one): FSDP2 shards over a device mesh,
    and its checkpoints are the same at every size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    # the loop's flags and clocks are CPU tensors: gloo carries them beside NCCL's CUDA gradients
    backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
    if world <= 1:
        if fsdp and not dist.is_initialized():
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        return Dist(), torch.device("cuda" if use_cuda else "cpu")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return Dist(rank, world), torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")


def shutdown() -> None:
    """Destroy the process group, after the DDP reducers and FSDP units that use it: FSDP's modules
    hold reference cycles, so they go at a collection, which must come before the group goes."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
