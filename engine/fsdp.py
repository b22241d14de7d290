"""`--fsdp`: weights, gradients and AdamW state sharded over the processes with torch's FSDP2.

Under DDP every process holds the whole model and its AdamW moments (16 bytes a trainable
parameter); under FSDP2 (`torch.distributed.fsdp.fully_shard`) each holds 1/world_size of them and
gathers a unit's weights only while it runs. The units:

    each Qwen decoder layer, then the rest of the trunk     (a trainable Qwen: full or LoRA)
    the prompt heads, the refiner, the agent, the task embedding      (one root each)

Why several roots instead of the whole ArcModel as one: Qwen does not run inside ArcModel.forward
(the prompt cache calls it, on refresh micro-batches only), and FSDP2 refuses a unit that runs
before its root has run once. A frozen Qwen is not sharded: it has no gradients and no AdamW state,
so sharding would save only its weights and would make every cache miss a collective. The RL head
stays replicated under DDP: it is tiny and trained by its own optimizer from detached tensors.

What FSDP asks of the loop, and where it is done:
- every forward and backward of a unit is a collective: every process runs backward on every
  micro-batch, even with a non-finite loss (training.train_step), and encodes as many chunks of Qwen
  texts as the process with the most (QwenTextEncoder.lockstep);
- gradients are sharded: the fp16 scaler and the clipping norm must see every shard (torch's
  GradScaler and clip_grad_norm_ do with DTensor gradients; engine/precision.py's group norms too);
- validation adapts weights per task, which sharded weights cannot do without every process in
  step: it runs on an unsharded copy (`unsharded_copy`);
- checkpoints are written by every process with torch.distributed.checkpoint (training/run_state.py).
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

