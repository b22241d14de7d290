"""Model FLOPs of training, counted by torch, and what share of the device's peak they are.

An episode at canvas side S costs the FLOPs torch's FlopCounterMode counts in one forward and
backward of the agent through both refinements (the step's two rows an episode) at S, counted once
a side on a copy of the agent as built (weights do not change FLOPs; the plain attention kernel, so
the counter sees its matrix products, which a fused kernel hides from it). A micro-batch costs its
episodes times that. Not counted: the prompt heads and a Qwen encoder (none in the lease recipe;
trained with LoRA in configs/gpu-1.toml and in full in gpu-8.toml, so their MFU leaves Qwen's work
out), the RL head and the optimizer: the figures are a lower bound of the work a step does, and
MFU the share of the device's bf16 peak those FLOPs a second are.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from agents import build_agent
from data.canvas import NUM_CLASSES
from engine.config import AgentCfg, Config

# Dense bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets (SXM parts); first match wins.
# A large bf16 matrix product reaches about 790 on an H200 (80% of its sheet's): the lease's report
# gives MFU against both (--peak_tflops sets the second).
BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
                    ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("RTX 4090", 165.0))


def bf16_peak_tflops(device: torch.device, given: float | None = None) -> float | None:
    """`given`, else the table's peak for a CUDA device's name; None on a CPU or an unknown GPU."""
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_TFLOPS if key in name), None)


CPU = torch.device("cpu")


def episode_flops(cfg: Config, side: int, device: torch.device = CPU) -> int:
    """FLOPs of one episode's forward and backward through the agent at canvas side `side`: both
    refinements (two rows), the prompt a random vector of the agent's prompt width. Built eager
    (`--compile` changes no FLOPs) on `device`, with torch's global random stream left as it was.
    Counted once a process for each agent, prompt width, side and device, of which the count is a
    function: a count builds an agent and steps it (60 ms at the tests' sizes, where one process
    trains many short runs of the same agent: 3% of their time)."""
    eager = dataclasses.replace(cfg.agent, compile=False, compile_scope=AgentCfg.compile_scope,
                                compile_backend=AgentCfg.compile_backend, compile_mode=AgentCfg.compile_mode)
    return _counted(eager, cfg.prompt.prompt_dim, side, device)


@functools.lru_cache(maxsize=256)
def _counted(agent_cfg: AgentCfg, prompt_dim: int, side: int, device: torch.device) -> int:
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(0)
        agent = build_agent(agent_cfg, prompt_dim=prompt_dim).to(device)
        canvas = torch.randint(0, NUM_CLASSES, (2, side, side), device=device)
        prompt = torch.randn(2, prompt_dim, device=device)
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            agent(canvas, prompt).float().logsumexp(-1).mean().backward()
    return counter.get_total_flops()


class TrainingFlops:
    """The model FLOPs of the micro-batches a process trains on, and their rate: over the whole run
    (`since_start`) and since the last `interval()` (a log step, where the host waits for the device
    anyway, so wall time there covers the work queued)."""

    def __init__(self, cfg: Config, device: torch.device, peak_tflops: float | None = None):
        self.cfg, self.device = cfg, device
        self.peak = bf16_peak_tflops(device, peak_tflops)
        self.per_side: dict[int, int] = {}
        self.total = self.episodes = 0
        self.mark = (0, 0, time.time())  # FLOPs, episodes and the time at the last interval

    def add(self, window: list[dict]) -> None:
        """Count a window's micro-batches: input [B, S, S] each (read from its shape: no device wait)."""
        for batch in window:
            b, side = batch["input"].shape[:2]
            if side not in self.per_side:
                self.per_side[side] = episode_flops(self.cfg, side, self.device)
            self.total += b * self.per_side[side]
            self.episodes += b

    def rates(self, flops: int, episodes: int, seconds: float, prefix: str) -> dict[str, float]:
        """TFLOP/s, MFU (with a known peak) and episodes a second of `flops` and `episodes` in `seconds`."""
        tflops = flops / max(seconds, 1e-9) / 1e12
        rates = {f"{prefix}model_tflops": tflops, f"{prefix}episodes_per_second": episodes / max(seconds, 1e-9)}
        if self.peak:
            rates[f"{prefix}mfu"] = tflops / self.peak
        return rates

    def restart_interval(self) -> None:
        """Start a new interval now (after a validation, whose time is not training's)."""
        self.mark = (self.total, self.episodes, time.time())

    def interval(self) -> dict[str, float]:
        """The rates since the last call (perf/* scalars; none when nothing was trained since), then a
        new interval."""
        flops, episodes, then = self.mark
        now = time.time()
        self.mark = (self.total, self.episodes, now)
        if self.episodes == episodes:
            return {}
        return self.rates(self.total - flops, self.episodes - episodes, now - then, "perf/")

    def since_start(self, train_seconds: float) -> dict[str, float]:
        """The rates over `train_seconds` of training (the run's clock: validation not counted, a
        compile counted) and the FLOPs themselves (summary.json's train_* figures)."""
        return {"train_pflop": self.total / 1e15, **self.rates(self.total, self.episodes, train_seconds, "train_")}
