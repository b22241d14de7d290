"""What every section of the GPU check is given: the device, the sizes, the output folder, the clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.step_profile import clock


@dataclass(frozen=True)
class Check:
    device: torch.device
    tiny: bool  # the CPU dry run: the same code at sizes that take seconds
    out: Path
    deadline: float  # time.monotonic() by which the whole check must be done

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

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
