"""The agents on the device: conv and rope at S = 30 (29x29 grids plus the
end-of-grid row), fp32 / bf16 autocast / `--compile` / graphs (`--compile --compile_mode
reduce-overhead`: CUDA graphs), at each micro-batch of `--agent_batches` (8: the default), timed as
`make bench-step` times them (bench/step_profile.py: the loop's whole step with the prompt cache
cold and warm, and the bare agent's forward and backward on the step's own batch; loop overhead = 1
- bare agent / warm step), and a profiled pass that splits the warm step into its phases' host time
and counts what it asks of the device: kernel launches, the share of the step the GPU is busy, and
host synchronizations a step. A case that fails records its error in its row and the others run. The
default agent (engine.config's `--agent`) runs first, every variant and micro-batch, so a section
cut by its time budget has measured it; the other agents follow.

Achieved TFLOP/s counts the bare agent's FLOPs (torch's FlopCounterMode over one more forward and
backward; `--compile` runs with `--canvas bucket`, on the bucket side holding the grids) over its
time; MFU sets them against the device's dense bf16 peak (`--peak_tflops`, or the table below by
device name; none on a CPU).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from agents import AGENTS
from bench.gpu_check.context import Check
from bench.gpu_check.report import Section, one_line
from bench.step_profile import PHASES, bare_agent_flops, case_config, timed_steps
from engine.config import AgentCfg
from training.flops import bf16_peak_tflops

VARIANTS = {"fp32": {}, "bf16": {"amp": "bf16"}, "compile": {"compile": True, "canvas": "bucket"},
            # the agent's forward and backward as CUDA graphs: what launch-bound steps should gain most from
            "graphs": {"compile": True, "compile_mode": "reduce-overhead", "canvas": "bucket", "adapt_tasks": 1}}
def cases(variants: tuple[str, ...], batches: tuple[int, ...]) -> list[tuple[str, str, int]]:
    """(agent, variant, micro-batch): the default agent at every variant and micro-batch first (a
    variant at each micro-batch before the next variant: a compile costs the section's time), then
    the other agents at every variant and the first micro-batch."""
    default = AgentCfg().agent
    return ([(default, v, b) for v in variants for b in batches]
            + [(a, v, batches[0]) for a in AGENTS if a != default for v in variants])


def run(check: Check, section: Section, variants: tuple[str, ...], peak_tflops: float | None,
        batches: tuple[int, ...] = (8,)) -> None:
    side, steps, warmup = (11, 1, 1) if check.tiny else (30, 15, 3)
    sizes = dict(agent_channels=16, prompt_dim=32) if check.tiny else {}
    peak = bf16_peak_tflops(check.device, peak_tflops)
    section.notes.append(f"{steps} steps after {warmup} warm-up; MFU against a bf16 peak of "
                         f"{peak if peak else 'unknown (--peak_tflops)'} TFLOP/s")
    failed = []
    with tempfile.TemporaryDirectory() as logs:
        for agent, variant, batch in check.budgeted(section, cases(variants, batches)):
            torch._dynamo.reset()  # each case compiles afresh
            try:
                section.rows.append(measure(check, agent, variant, side, steps, warmup, dict(sizes, batch_size=batch),
                                            peak, Path(logs) / f"{agent}-{variant}-{batch}"))
            except Exception as err:  # one case's failure (a compile mode on this device) spares the others
                section.rows.append({"agent": agent, "variant": variant, "batch": batch, "error": one_line(err)})
                failed.append(f"{agent}/{variant}/{batch}")
    if failed:  # recorded in each case's row; the section fails
        section.error = f"{len(failed)} case(s) failed: {', '.join(failed)} (their rows give the errors)"


def measure(check: Check, agent: str, variant: str, side: int, steps: int, warmup: int, sizes: dict,
            peak: float | None, log_dir: Path) -> dict:
    """One agent and variant, timed and profiled as the section's docstring says. -> its row."""
    # enough synthetic tasks (about 3 episodes each) for every window of the three passes in one epoch
    tasks = max(200, -(-sizes["batch_size"] * (warmup + steps) // 3))
    cfg = case_config(agent, side, tasks, device=check.device.type, **VARIANTS[variant], **sizes)
    r = timed_steps(cfg, steps, warmup, log_dir, check.device)
    flops = bare_agent_flops(r["state"], r["warm"]["batch"], cfg.prompt.prompt_dim)
    cold, warm = (sum(r[p][k] for k in ("data", "train_step", "logging")) for p in ("cold", "warm"))
    bare = r["warm"]["bare"]
    achieved = flops / bare / 1e12
    return {
        "agent": agent, "S": r["side"], "variant": variant, "batch": cfg.data.batch_size,
        "step cold ms": round(1e3 * cold, 1), "step warm ms": round(1e3 * warm, 1),
        "episodes/s": round(cfg.data.batch_size / warm), "bare agent ms": round(1e3 * bare, 1),
        "loop overhead": f"{1 - bare / warm:.0%}", "agent GFLOP": round(flops / 1e9, 2),
        "TFLOP/s": achieved, "MFU": f"{achieved / peak:.1%}" if peak else "n/a",
        **{f"{phase.removeprefix('step/')} host ms": round(1e3 * r["phases"].get(phase, 0.0), 1)
           for phase in PHASES},
        "kernels/step": round(r["phases"]["kernels"]), "GPU busy": f"{r['phases']['gpu busy'] / warm:.0%}",
        "syncs/step": round(r["phases"]["syncs"], 1),
        "sync wait ms/step": round(1e3 * r["phases"]["sync wait"], 2)}
