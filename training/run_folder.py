"""The run folder's own files: opening it (the start-up lines, the TensorBoard writer) and
summary.json, the mark of a finished run. Checkpoints are training/run_state.py's; reports and
task images, training/validation.py's."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tqdm import tqdm

from engine.checkpoint import damage
from engine.config import Config, RunCfg
from engine.distributed import Dist
from engine.errors import ConfigError
from engine.files import write_atomic
from engine.precision import slow_precision
from engine.run_logger import RunLogger
from training.build import TrainingData
from training.run_state import TrainState

SUMMARY_FILE = "summary.json"
LOCK_FILE = "run.lock"  # who holds the folder: "HOST pid PID", locked while that process runs


def plan_run_dir(run: RunCfg, resumed_from: Path | None) -> Path:
    """The run folder, not created yet (nothing is written before every input is checked): the resumed
    run's when training continues, else a new one, so no evaluation overwrites a finished run. An
    --eval_only folder (no checkpoints, an `evaluate` journal) may be named again, finished or not: its
    journal scores the tasks it lacks and the groups a larger set changed (docs/runs.md) and refuses
    other weights or flags."""
    continuing = resumed_from is not None and not run.eval_only
    if run.run_dir:
        path = Path(run.run_dir)
        trained = (path / "checkpoints").exists()
        evaluation = run.eval_only and not trained and any((path / "journal").glob("evaluate.rank*.jsonl"))
        held = trained or (path / SUMMARY_FILE).exists()
        if continuing and held and path.resolve() != resumed_from.parent.parent.resolve():
            # two runs' checkpoints, events and summary in one folder: neither could be resumed as it ran
            raise ConfigError(f"--run_dir {path} holds another run than --resume {run.resume}: pass --resume {path} "
                              f"to continue the run there, or choose an empty --run_dir")
        if not continuing and held and not evaluation:
            advice = "choose another --run_dir" if run.eval_only else \
                f"pass --resume {path} to continue it, or choose another --run_dir"
            raise ConfigError(f"--run_dir {path} already holds a run: {advice}")
        return path
    if continuing:
        return resumed_from.parent.parent
    name = f"{run.run_name}-eval" if run.eval_only else run.run_name
    return Path("runs") / f"{name}__{run.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def agreed_run_dir(run: RunCfg, resumed_from: Path | None, dist: Dist) -> Path:
    """`plan_run_dir` as the main process plans it, on every process: a folder named by the clock could
    differ between processes started a second apart (collective)."""
    return Path(dist.gather(str(plan_run_dir(run, resumed_from)))[0])


def refuse_an_older_start(path: Path, resumed_from: Path, resume: str) -> None:
    """Training continues in its run folder `path` only from the folder's newest intact checkpoint: from
    an older one (a `marks/` copy, a step named) the later ones would sort after the new ones and the
    pruning (--keep_checkpoints) delete what the continuation writes. Asked once the folder is held
    (`holding`), so a run still writing checkpoints there is refused as the folder's holder."""
    # the checkpoint resumed was checked already: only the folder's later ones are (a resume of the newest
    # checks nothing again; a newer one that is damaged is what the resume fell back past)
    own = resumed_from.parent.resolve() == (path / "checkpoints").resolve()
    later = sorted(c for c in (path / "checkpoints").glob("step_*") if not own or c.name > resumed_from.name)
    newer = next((c for c in reversed(later) if damage(c) is None), None)
    if newer is not None:
        raise ConfigError(f"--resume {resume}: {path} has a newer checkpoint ({newer.name}): pass --resume {path} "
                          f"to continue it, or an empty --run_dir to train on from {resumed_from.name} apart")


@contextlib.contextmanager
def holding(run_dir: Path, dist: Dist) -> Iterator[None]:
    """The run folder held by this run while it trains or validates there, so two runs never write
    one folder: the main process locks RUN/run.lock, a lock the operating system drops when the
    process ends however it ends (a SIGKILL leaves nothing stale). Another fixed.py on the folder is
    refused in one line naming the host and pid that hold it (ConfigError, on every process). A
    folder made for the lock and left holding only it by a failed start is removed."""
    handle, refused, created = None, None, False
    if dist.is_main:
        created = not run_dir.exists()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            handle, refused = _lock(run_dir / LOCK_FILE)
        except OSError as err:  # a file there or above it, a folder not writable: refused on every process alike
            refused = f"--run_dir {run_dir}: cannot be a run folder ({err.strerror})"
    refused = dist.gather(refused)[0]
    if refused:
        raise ConfigError(refused)
    try:
        yield
    except BaseException:
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_FILE]:
            shutil.rmtree(run_dir)
        raise
    finally:
        if handle is not None:
            handle.close()


def _lock(path: Path) -> tuple[IO | None, str | None]:
    """An exclusive lock on `path`, its holder written in it -> (the open file, None), or (None, why
    not: the holder, and how to clear a lock its filesystem kept for a process that is gone)."""
    handle = open(path, "a+")  # noqa: SIM115 - held open for the run: the lock lives as long as the file does
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().split()
        handle.close()
        host, pid = (holder[0], holder[-1]) if len(holder) == 3 else ("an unknown host", "unknown")
        if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
            return None, (f"run folder {path.parent}: locked for pid {pid} on {host}, which has ended; its filesystem "
                          f"kept the lock: delete {path} to clear it")
        return None, (f"run folder {path.parent}: in use by pid {pid} on {host}: wait for it to end or choose another "
                      f"--run_dir (if that process is gone and a network filesystem kept its lock, delete {path})")
    handle.truncate(0)  # (a+: every write goes to the end, here the start)
    handle.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    handle.flush()
    return handle, None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


def announce(dist: Dist, line: str) -> None:
    """One line on the console from the main process, above any progress bar."""
    if dist.is_main:
        tqdm.write(line, file=sys.stderr)


def open_run(run_dir: Path, cfg: Config, state: TrainState, data: TrainingData, dist: Dist,
             what: str, validation: str = "") -> RunLogger | None:
    """Create the run folder and its TensorBoard writer, and print the start-up lines (main process)."""
    if not dist.is_main:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    device = next(state.model.parameters()).device
    sharded = " sharded (--fsdp)" if cfg.optim.fsdp else ""
    print(f"run {run_dir} ({what}) | device={device} amp={cfg.optim.amp} world_size={dist.world_size}{sharded} | "
          f"data {data.splits.name}: {len(data.splits.training)} training, {data.evaluation} evaluation "
          f"tasks | {state.model.description()} [qwen {cfg.qwen.qwen_train}]", file=sys.stderr)
    for note in data.splits.notes:
        print(note, file=sys.stderr)
    if validation:
        print(validation, file=sys.stderr)
    slow = slow_precision(cfg.optim.amp, device)
    if slow:
        print(slow, file=sys.stderr)
    # A resumed run rewrites the steps after its checkpoint: TensorBoard drops the old ones.
    steps = state.counters.optimizer_steps
    return RunLogger(run_dir, cfg.flags(), state.model.description(), purge_step=steps + 1 if steps else None)


def finish_run(run_dir: Path, logger: RunLogger | None, started: float, steps: int, metrics: dict,
               dist: Dist, submission: str = "") -> dict:
    """Write summary.json (main process), the mark of a finished run: whole or not at all, as a
    reader (or a run killed while writing it) sees it; `submission`: the file the run wrote, if any.
    -> the summary."""
    summary = {"steps": steps, "seconds": round(time.time() - started, 1), "run_dir": str(run_dir),
               "world_size": dist.world_size, **metrics, **({"submission": submission} if submission else {})}
    if logger is not None:
        summary.update({k: logger.last[k] for k in ("loss/combined", "loss/efe", "rl/reward") if k in logger.last})
        write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary
