"""What an agent's training step costs: FLOPs (torch's count) and time, agent against agent.

    python -m bench.agent_cost [--sides 12,30] [--batch 8] [--repeats 5] [--device cpu]
        [--setting name:flag=value,flag=value ...]

Each setting is an agent built from its flags (the default settings: the default conv agent, the
rope agent at the width whose FLOPs an episode at side 30 come nearest the conv agent's, and the
rope agent at configs/gpu-lease.toml's size). For each canvas side: the FLOPs of one episode's
forward and backward through both refinements (training/flops.py's count), and the median time of
`--repeats` forward-and-backward passes of a micro-batch of `--batch` episodes (2 x batch rows, the
step's) after one warm-up, on random canvases and prompts; achieved GFLOP/s is their ratio. The
agent alone: the prompt, the loss, the optimizer and the loader are `make bench-step`'s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agents import build_agent
from bench.step_profile import clock
from data.canvas import NUM_CLASSES
from engine.config import Config
from training.cli import read_config_file
from training.flops import episode_flops

LEASE = "configs/gpu-lease.toml"


def parse_setting(text: str) -> tuple[str, dict]:
    """'name:flag=value,flag=value' -> (name, {flag: value as int when it reads as one})."""
    name, _, flags = text.partition(":")
    pairs = [f.split("=", 1) for f in flags.split(",") if f]
    return name, {k: int(v) if v.isdigit() else v for k, v in pairs}


def matched_rope_width(side: int = 30, layers: int = 3) -> int:
    """The rope agent's width (a multiple of 16) whose episode FLOPs at `side` are nearest the
    default conv agent's, at `layers` layers."""
    target = episode_flops(Config(), side)
    widths = range(16, 257, 16)
    return min(widths, key=lambda w: abs(episode_flops(Config.from_flags(agent="rope", agent_channels=w,
                                                                         agent_layers=layers), side) - target))


def default_settings() -> list[tuple[str, dict]]:
    lease = read_config_file(LEASE)
    width = matched_rope_width()
    return [("conv (default)", {}), (f"rope {width}x3 (conv's FLOPs at 30)", dict(agent="rope", agent_channels=width,
                                                                               agent_layers=3)),
            ("rope, the lease's size", {k: lease[k] for k in ("agent", "agent_channels", "agent_layers")})]


def step_seconds(cfg: Config, side: int, batch: int, repeats: int, device: torch.device) -> float:
    """The median seconds of a forward and backward of 2 x `batch` rows at `side` (one warm-up first)."""
    torch.manual_seed(0)
    agent = build_agent(cfg.agent, prompt_dim=cfg.prompt.prompt_dim).to(device)
    canvas = torch.randint(0, NUM_CLASSES, (2 * batch, side, side), device=device)
    prompt = torch.randn(2 * batch, cfg.prompt.prompt_dim, device=device)
    times = []
    for _ in range(repeats + 1):
        start = clock(device)
        agent(canvas, prompt).float().logsumexp(-1).mean().backward()
        times.append(clock(device) - start)
        agent.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", default="12,30")
    ap.add_argument("--batch", type=int, default=8, help="episodes a micro-batch (2 rows each)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--setting", nargs="*", help="name:flag=value,... (default: conv, matched rope, lease rope)")
    args = ap.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    device = torch.device(args.device)
    settings = [parse_setting(s) for s in args.setting] if args.setting else default_settings()
    print(f"| agent | parameters | side | GFLOP an episode | ms a micro-batch of {args.batch} | GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, flags in settings:
        cfg = Config.from_flags(**flags)
        params = sum(p.numel() for p in build_agent(cfg.agent, prompt_dim=cfg.prompt.prompt_dim).parameters())
        for side in (int(s) for s in args.sides.split(",")):
            flops = episode_flops(cfg, side, device)
            seconds = step_seconds(cfg, side, args.batch, args.repeats, device)
            print(f"| {name} | {params / 1e6:.2f}M | {side} | {flops / 1e9:.2f} | {1e3 * seconds:.0f} | "
                  f"{args.batch * flops / seconds / 1e9:.1f} |", flush=True)
    print(f"({time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} threads, torch {torch.__version__})")


if __name__ == "__main__":
    main()
