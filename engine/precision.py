"""One mixed-precision step routine for `--amp off | bf16 | fp16`.

    with amp.autocast(): loss = ...        # a no-op when amp is off
    amp.backward(loss)                     # scaler.scale(loss).backward() under fp16 only
    result = amp.step(optimizer, clip)     # unscale_ -> clip -> step -> update, once per window

The scaler exists only for fp16 (bf16 has the range of fp32), and a scaler call is made only for an
optimizer that holds gradients; a step with non-finite gradients is skipped (docs/invariants.md #1, #3).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor

AMP_MODES = ("off", "bf16", "fp16")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    stepped: bool
    grad_norm: float  # total norm of the unscaled gradients before clipping (nan/inf when skipped)
    group_norms: dict[str, torch.Tensor] = field(default_factory=dict)  # [] float32 each, read at log steps


# CPU features that give torch native kernels for a low precision (torch.cpu.get_capabilities: x86 and ARM names)
NATIVE_CPU_FEATURES = {"bf16": ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"),
                       "fp16": ("avx512_fp16", "amx_fp16", "fp16_arith")}


def slow_precision(mode: str, device: torch.device) -> str | None:
    """One line when `--amp mode` has no native kernels on this processor (a CPU without AVX-512 BF16,
    AMX or their ARM twins): torch then emulates it, and a step runs several times slower than in
    float32 (9x for the conv agent measured on an AVX2 CPU). None where it is native, or on a GPU."""
    if mode == "off" or device.type != "cpu":
        return None
    caps = torch.cpu.get_capabilities()
    if any(caps.get(feature) for feature in NATIVE_CPU_FEATURES[mode]):
        return None
    return (f"warning: --amp {mode}: this CPU ({caps.get('cpu_name', 'unknown')}) has no native {mode} kernels "
            f"({' / '.join(NATIVE_CPU_FEATURES[mode])}): steps run several times slower than --amp off")


def flush_denormals() -> bool:
    """Have the CPU compute float32 denormals (below 1.2e-38) as zero, read and written (x86's FTZ and
    DAZ; ARM's FZ): why, and why first thing in every run (engine.loop.seed_everything), docs/results.md
    "Denormal floats". A GPU's kernels flush already. -> whether this CPU can (False: nothing changes)."""
    return torch.set_flush_denormal(True)


class Float32LayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm computed in float32 under any autocast -> float32 [..., C] (its input and weights
    cast up first: FSDP's bf16 parameters too): tasks adapted together under CPU bf16 need it, as
    vmap cannot batch the mixed-type backward (docs/adaptation.md). Same state dict keys as nn.LayerNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return torch.nn.functional.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


def check_master_weights(params: list[torch.nn.Parameter], what: str) -> None:
    """Refuse trainable weights that are not float32 (GradScaler cannot unscale fp16 gradients)."""
    bad = {str(p.dtype) for p in params if p.requires_grad and p.dtype != torch.float32}
    if bad:
        raise ValueError(f"{what}: trainable weights must be float32, found {', '.join(sorted(bad))}; "
                         f"keep weights in float32 and use --amp bf16/fp16 for low-precision compute")


def autocast(mode: str, device_type: str) -> contextlib.AbstractContextManager:
    """Autocast to bf16/fp16 on `device_type`; a no-op when mode is off."""
    if mode == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=AMP_DTYPES[mode])


def _norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The total norm of the gradients of `params`. Sharded (FSDP) gradients are DTensors, each
    process holding a part: torch's norm of them is partial per process and `full_tensor` sums
    the parts (a collective every process calls alike)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class MixedPrecision:
    def __init__(self, mode: str, device: torch.device, *, init_scale: float = 2.0**16):
        if mode not in AMP_MODES:
            raise ValueError(f"--amp {mode}: choose one of {', '.join(AMP_MODES)}")
        self.mode = mode
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if mode == "fp16" else None
        self.skipped_steps = 0

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.mode, self.device_type)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    @property
    def scales_loss(self) -> bool:
        """Whether a loss scaler runs (fp16): its skipped steps are then its search for a scale."""
        return self.scaler is not None

    @property
    def scale(self) -> float:
        return self.scaler.get_scale() if self.scaler is not None else 1.0

    def step(self, optimizer: torch.optim.Optimizer, clip: float,
             watch: dict[str, list[torch.nn.Parameter]] | None = None) -> StepResult | None:
        """Unscale, clip (`clip <= 0`: no clipping), step and update; then zero the gradients.

        Returns None, making no scaler call at all, when no parameter of `optimizer` has a gradient
        (nothing went backward into it in this window). `watch` names parameter groups whose
        unscaled gradient norms are reported.
        """
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)  # clipping and norms must see the true gradients
        group_norms = {name: _norm(ps) for name, ps in (watch or {}).items()}  # tensors: no host sync here
        # The one value the optimizer step reads from the device (docs/invariants.md #3; the window's
        # micro-batches each read their loss's finiteness before it, training/step.py): after unscale_
        # the norm is finite exactly when every gradient is, which is also when the scaler steps.
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"), foreach=True))
        stepped = math.isfinite(norm)
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips optimizer.step() itself on inf/nan gradients
            self.scaler.update()  # halves the scale after a skip
        elif stepped:
            optimizer.step()
        self.skipped_steps += not stepped
        optimizer.zero_grad(set_to_none=True)
        return StepResult(stepped, norm, group_norms)

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = state["skipped_steps"]
