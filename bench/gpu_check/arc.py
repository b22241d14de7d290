"""ARC on a GPU budget: fixed.py itself, with the README's one-GPU recipe (configs/gpu-1.toml: the
rope agent at about VARC's size, 256 views voted; the Qwen2.5-0.5B shape with random weights, so the
check needs no download), trains on ARC-AGI-1, with RE-ARC
when `--re_arc` names its zip or folder (the machine has no network to fetch it), for
`--arc_minutes`, then its final validation scores the first `--arc_tasks` evaluation tasks with the
recipe's per-task adaptation under `--eval_minutes` (evaluation/deadline.py: steps and views cut to
fit, the tasks left at the deadline predicted unadapted), so the section ends with scores however
slow a task is on the machine. Then, while time is left, `bench.ttt_curve` on the run's checkpoint:
what test-time training fits and what it generalizes after this much training.

Both run as child processes with the check's deadline as their limit: at the deadline the run gets
SIGTERM (it saves and stops within seconds) and the section records where it was.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.gpu_check.context import RECIPE, RECIPE_QWEN, Check
from bench.gpu_check.report import Section

ROOT = Path(__file__).resolve().parents[2]
# the README's one-GPU recipe, with Qwen2.5-0.5B's shape and random weights (no download there)
ONE_GPU_RECIPE = ("--config", RECIPE, "--qwen_model", RECIPE_QWEN)
# the same code at sizes a CPU runs in seconds: the recipe's agent and validation, smaller (and eager)
TINY_SIZES = ("--qwen_model", "tiny", "--agent_channels", "16", "--agent_layers", "1", "--agent_cycles", "1",
              "--prompt_dim", "32", "--no-compile",
              "--batch_size", "8", "--num_workers", "0", "--eval_augments", "8", "--ttt_batch_size", "8",
              "--heldout_tasks", "8",  # the held-out loss on 8 tasks, not 400 (10 of the run's 22 s on 2 cores)
              # a task's adaptation: 8 steps, not 60 or a small task's 120 (1.2 s, not 7.3, a task on 2 cores)
              "--ttt_steps", "8", "--ttt_small_steps", "8")
CPU_REFERENCE = ("CPU reference (2 cores, the tiny Qwen): `make run` validates at about 4 s a task "
                 "(docs/results.md); the weights as built score 6.9% of ARC-AGI-1's "
                 "evaluation tasks after per-task adaptation (docs/results.md)")
# tqdm's "epoch 1/1000:  26%|██▌  | 55/215 [00:20<01:02, 2.5batch/s]": a message printed as the run
# stops can follow it on the same line (the bar leaves no newline)
PROGRESS_BAR = re.compile(r"^.*\d+%\|.*?\]")
GRACE_SECONDS = 30  # from SIGTERM to SIGKILL: a stopped run saves its checkpoint in this time
# the interpreter every child runs on, its command (the tests' is a warm one: tests/warm_python.py)
PYTHON: tuple[str, ...] = (sys.executable,)


def run_child(check: Check, argv: list[str], log: Path, reserve: float = 0.0,
              poll: Callable[[], bool] | None = None, every: float = 1.0) -> tuple[int, bool]:
    """Run `python argv` (PYTHON's) from the repository root, output to `log`, until it ends or the
    check's deadline less `reserve` seconds; then SIGTERM, and SIGKILL after the grace. `poll`, called
    every `every` seconds while the child runs: True stops it as the deadline would. -> (exit code,
    stopped)."""
    end = time.monotonic() + max(check.seconds_left() - reserve, 1.0)
    with open(log, "w") as out:
        child = subprocess.Popen([*PYTHON, *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while True:
            left = end - time.monotonic()
            try:
                return child.wait(timeout=max(min(left, every) if poll is not None else left, 0.01)), False
            except subprocess.TimeoutExpired:
                if time.monotonic() >= end or (poll is not None and poll()):
                    break
        child.send_signal(signal.SIGTERM)
        try:
            return child.wait(timeout=GRACE_SECONDS), True
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait(), True


def last_line(log: Path) -> str:
    """The log's last line that is not a progress bar (a bar closing may come after the last message;
    a message written right after a bar is kept without it)."""
    lines = [rest for line in log.read_text(errors="replace").splitlines()
             if (rest := PROGRESS_BAR.sub("", line)).strip()]
    return lines[-1][-300:] if lines else "(no output)"


def training_data(re_arc: str | None) -> str:
    """--data of the ARC run: the recipe's own sources, its RE-ARC source at the path the check was
    given (the recipe's path is the user's download, absent on the GPU machine) or left out."""
    from training.cli import read_config_file

    sources = [s for s in read_config_file(str(ROOT / ONE_GPU_RECIPE[1]))["data"].split(",")
               if not s.startswith("re-arc:")]
    return ",".join(sources + ([f"re-arc:{Path(re_arc).resolve()}"] if re_arc else []))


def run(check: Check, section: Section, minutes: float, eval_minutes: float, tasks: int,
        re_arc: str | None = None, overrides: Sequence[str] = ()) -> Path | None:
    """Train for `minutes`, then validate within `eval_minutes`, the recipe's flags changed by
    `overrides` ("adapt_tasks=8": fixed.py's flags, last); -> the run folder when it saved a
    checkpoint, else None."""
    run_dir = check.out / "arc_run"
    argv = ["fixed.py", "--device", check.device.type, *ONE_GPU_RECIPE,
            "--data", training_data(re_arc),
            *(TINY_SIZES if check.tiny else ()), "--epochs", "1000", "--max_minutes", f"{minutes:g}",
            "--val_every", "end", "--eval_tasks", str(tasks), "--eval_minutes", f"{eval_minutes:g}",
            "--run_dir", str(run_dir),
            "--prompt_cache_dir", str(check.out / "arc_prompt_cache"),
            *(arg for flag in overrides for arg in ("--" + flag.split("=", 1)[0], flag.split("=", 1)[1]))]
    section.notes += [f"`python {' '.join(argv)}`", CPU_REFERENCE]
    log = check.out / "arc_run.log"
    code, stopped = run_child(check, argv, log, reserve=GRACE_SECONDS)
    summary = run_dir / "summary.json"
    if code != 0 or not summary.exists():
        why = "stopped at the check's deadline" if stopped else f"exit code {code}"
        section.error = f"fixed.py {why}: {last_line(log)}"
        return run_dir if (run_dir / "checkpoints" / "latest").exists() else None
    s = json.loads(summary.read_text())
    section.rows.append({
        "train s": s["train_seconds"], "steps": s["steps"], "steps/s": round(s["steps"] / s["train_seconds"], 2),
        "eval tasks": int(s["eval/tasks"]), "pass@2": s["eval/pass2"], "oracle": s["eval/oracle"],
        "exact": s["eval/exact"], "cell acc": s["eval/cell_acc"], "copy cell acc": s["eval/copy_cell_acc"],
        "s/task": s["eval/seconds_per_task"], "TTT steps/task": s["eval/ttt_steps_per_task"],
        "validation s": s["validation_seconds"], "full / cut / late": "{:.0f} / {:.0f} / {:.0f}".format(
            *(s.get(f"eval/deadline_{k}", 0) for k in ("full", "cut", "late")))})
    return run_dir


def ttt_curve(check: Check, section: Section, run_dir: Path, tasks: int, marks: str) -> None:
    """bench.ttt_curve on the run's checkpoint, rows from its --json output."""
    rows = check.out / "ttt_curve.json"
    argv = ["-m", "bench.ttt_curve", str(run_dir), "--tasks", str(tasks), "--marks", marks,
            "--device", check.device.type, "--json", str(rows)]
    section.notes.append(f"`python {' '.join(argv)}`: identity view, no voting; see `make bench-ttt-curve`")
    log = check.out / "ttt_curve.log"
    code, stopped = run_child(check, argv, log)
    if code != 0 or not rows.exists():
        section.error = f"bench.ttt_curve {'stopped at the deadline' if stopped else f'exit code {code}'}: " \
                        f"{last_line(log)}"
        return
    section.rows += json.loads(rows.read_text())
