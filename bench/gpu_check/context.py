"""What every section of the GPU check is given: the device, the sizes, the output folder, the clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.step_profile import clock

# The one-GPU recipe the sections run, with Qwen2.5-0.5B's shape and random weights (nothing can be
# downloaded on the GPU machine), and the sizes at which a CPU runs the same code in seconds.
RECIPE = "configs/gpu-1.toml"
RECIPE_QWEN = "random:Qwen/Qwen2.5-0.5B"
# (eager: a compile of even a tiny agent takes a CPU half a minute; tests/test_agents.py compiles it)
TINY_RECIPE = dict(qwen_model="tiny", agent_channels=16, agent_layers=1, agent_cycles=1, prompt_dim=32, compile=False)


@dataclass(frozen=True)
class Check:
    device: torch.device
    tiny: bool  # the CPU dry run: the same code at sizes that take seconds
    out: Path
    deadline: float  # time.monotonic() by which the whole check must be done
    budgets: dict[str, float] = field(default_factory=dict)  # seconds a section may start cases in
    # called after each case a section runs through `budgeted`: the report rewritten with its rows so
    # far, so a check stopped from outside (the device call's limit) keeps every finished case
    after_case: Callable[[], None] = lambda: None

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def budgeted(self, section, cases: Sequence) -> Iterator:
        """The section's cases, one after another, while its budget and the check's time last (the
        first always runs); those it leaves are named in a note."""
        budget = self.budgets.get(section.name, float("inf"))
        started = time.monotonic()
        for i, case in enumerate(cases):
            spent = f"the section's {budget:.0f} s" if time.monotonic() - started > budget else \
                "the check's --minutes" if self.seconds_left() <= 0 else None
            if i and spent:
                section.notes.append(f"not run, {spent} were spent: "
                                     + ", ".join("/".join(map(str, c)) for c in cases[i:]))
                return
            yield case
            self.after_case()

    def clock(self) -> float:
        return clock(self.device)

    def reset_peak_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_gib(self) -> float | None:
        """torch.cuda.max_memory_allocated since the last reset, GiB (None on a CPU)."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device) / (1 << 30)
