"""Loop plumbing with no ML in it: moving batches, accumulation windows, seeds, signals, the summary."""

from __future__ import annotations

import os
import random
import signal
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import DataLoader

from engine.checkpoint import rng_state, set_rng_state
from engine.precision import flush_denormals


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`, without holding the host: a copy to a GPU goes through pinned memory (one from
    pageable memory waits for the work queued before it, as a synchronization would)."""
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()  # itself when pinned already (the loader pins its batches on a GPU machine)
    return t.to(device, non_blocking=True)


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on `device` (host_to_device), its other values as they are."""
    return {k: host_to_device(v, device) if torch.is_tensor(v) else v for k, v in batch.items()}


def seed_everything(seed: int) -> None:
    """The state every run, bench and test starts from: Python's, numpy's and torch's generators
    seeded, and the CPU's denormals flushed (first, before torch starts its threads: see
    flush_denormals)."""
    flush_denormals()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def epoch_windows(loader: DataLoader, n_batches: int, grad_accum: int, device: torch.device):
    """Yield lists of up to `grad_accum` micro-batches, `n_batches` micro-batches in all."""
    window = []
    for i, batch in zip(range(n_batches), loader, strict=False):
        window.append(to_device(batch, device))
        if len(window) == grad_accum or i == n_batches - 1:
            yield window
            window = []


class StopRequest:
    """SIGINT/SIGTERM set a flag that the loop (at the next window boundary), validation (at the next
    task group) and adaptation (at the next step) read; the run then saves what it trained and stops.
    A second signal ends the process at once, without saving: the newest complete checkpoint stands."""

    def __init__(self, announce: bool = True):
        self.signum = 0
        self.announce = announce  # one process says what happens (every process receives the signal)

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __call__(self) -> bool:
        """Whether this process has been asked to stop."""
        return self.signum != 0

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum:
            _say(f"{name} again: stopping now, without saving (the newest complete checkpoint stands)\n")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        if self.announce:
            _say(f"\n{name}: stopping within seconds, what has trained saved ({name} again stops at once, "
                 f"without saving)\n")

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _say(text: str) -> None:
    # Straight to the file descriptor: a signal handler that used sys.stderr while the progress bar
    # was writing to it would re-enter its buffer (RuntimeError: reentrant call).
    os.write(2, text.encode())


class Interrupted(Exception):
    """Raised where every process agreed to stop early (validation, adaptation): nothing it was doing
    is kept; the caller says what was saved and how to go on."""

    def __init__(self, signum: int, partial: dict | None = None):
        """`partial`: figures of what was done before the stop, for a caller to log as such (the
        held-out loss of the pairs measured: heldout/*_pairs says how many)."""
        super().__init__(signal.Signals(signum).name)
        self.signum, self.partial = signum, partial or {}


@contextmanager
def preserved_rng():
    """Run a block (validation) without moving the training's random streams: a run that validates
    more or less often trains bit for bit the same."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


class TrainingStopped(Exception):
    """The run stopped early with a checkpoint; the message says why and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def by_signal(cls, signum: int, detail: str) -> TrainingStopped:
        """`stopped by SIGTERM <detail>`, exit code 128 + the signal, as a shell reports a signal."""
        return cls(f"stopped by {signal.Signals(signum).name} {detail}", 128 + signum)


def duration(seconds: float) -> str:
    """4.2 s, 3.5 min, 2.1 h: a time as a reader takes it in."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def summary_line(s: dict) -> str:
    """The last line of a run: what it did, what it scored, where it wrote."""
    if "evaluated" in s:  # --eval_only: the steps are the weights', the seconds the scoring's
        parts = [f"done: {s['steps']} steps' weights ({s['evaluated']}) scored in {s['seconds']:.1f}s"]
    else:
        parts = [f"done: {s['steps']} steps ({s['train_seconds']:.1f}s of training, {s['seconds']:.1f}s in all)"]
    if "loss/combined" in s:
        parts.append(f"loss {s['loss/combined']:.4f} (efe {s['loss/efe']:.4f}, reward {s['rl/reward']:+.4f})")
    if "eval/cell_acc" in s:
        parts.append(f"eval on {s['eval/tasks']:.0f} tasks: cell_acc {s['eval/cell_acc']:.3f} exact "
                     f"{s['eval/exact']:.3f} pass@2 {s['eval/pass2']:.3f} ({s['eval/seconds_per_task']:.2f} s/task; "
                     f"copy baseline {s['eval/copy_cell_acc']:.3f} / {s['eval/copy_exact']:.3f})")
    if s.get("eval/unanswered"):
        parts.append(f"{s['eval/unanswered']:.0f} test inputs without a known output predicted, not scored")
    if s.get("validations") or s.get("validations_skipped"):
        parts.append(f"validation {s['validation_share']:.0%} of the time ({s['validations']} during training, "
                     f"{s['validations_skipped']} skipped)")
    parts.append(f"run {s['run_dir']}")
    if s.get("submission"):
        parts.append(f"submission {s['submission']}")
    return " | ".join(parts)


