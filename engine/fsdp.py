"""`--fsdp`: weights, gradients and AdamW state sharded over the processes with torch's FSDP2
(docs/distributed.md: what it saves, what the loop does for it). The units:

    each Qwen decoder layer, then the rest of the trunk     (a trainable Qwen: full or LoRA)
    the prompt heads, the refiner, the agent, the task embedding      (one root each)

Why several roots instead of the whole ArcModel as one: Qwen does not run inside ArcModel.forward
(the prompt cache calls it, on refresh micro-batches only), and FSDP2 refuses a unit that runs
before its root has run once. A frozen Qwen is not sharded: that would save only its weights and
make every cache miss a collective. The RL head stays replicated under DDP: it is tiny and trained
by its own optimizer from detached tensors. Gradients are sharded: torch's GradScaler and
clip_grad_norm_ see every shard of DTensor gradients, and engine/precision.py's group norms too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from engine.distributed import Dist, weights_checksum
from engine.precision import AMP_DTYPES


def shard_model(model: nn.Module, dist: Dist, device: torch.device, amp: str) -> None:
    """Shard `model` (an ArcModel) in place over every process. Weights must already be identical
    on every process (FSDP2 does not broadcast; they are built from one seed): checked here.

    Mixed precision follows `amp`: units compute in bf16/fp16 from float32 master shards, and
    gradients are reduced in float32."""
    sums = dist.gather(weights_checksum(model))
    if len(set(sums)) > 1:
        raise RuntimeError(f"--fsdp: the processes built different weights ({sums}); FSDP2 does not broadcast them")
    mesh = init_device_mesh(device.type, (dist.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=AMP_DTYPES.get(amp), reduce_dtype=torch.float32)
    for unit in model.fsdp_units():
        if any(p.requires_grad for p in unit.parameters()):
            fully_shard(unit, mesh=mesh, mp_policy=policy)
    if model.trains_qwen:
        model.encode_in_lockstep(dist.max_int)


def unsharded_copy(model: nn.Module, replica: nn.Module) -> nn.Module:
    """`replica` (an unsharded model of the same build) given `model`'s weights, buffers and RL noise
    state. Collective: every process gathers each sharded tensor, one at a time, in one order."""
    mine = replica.state_dict()
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if not isinstance(value, DTensor) and value.data_ptr() == mine[name].data_ptr():
                continue  # a frozen Qwen both share
            mine[name].copy_(value.full_tensor() if isinstance(value, DTensor) else value)
    replica.set_rl_noise_state(model.rl_noise_state())
    return replica

