"""The validation journal: each task's result written down as it finishes, so a stopped validation
continues where it stopped (docs/runs.md, "Validation, test-time training, submission": "A validation
that survives a stop").

Each process appends one JSON line per finished task to its own file, flushed and fsynced, after a header
of what produced it (`identity`: the number of processes decides which process takes which task); the same
command run again scores only the tasks not in it. A torn last line (the process killed mid-write) is
dropped; a damaged line before it is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.config import RESULT_FREE, Config
from engine.errors import ConfigError

if TYPE_CHECKING:
    from evaluation.scores import TaskScores


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's trainable state, names and values in name order (hex, 16 digits)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.trainable_state().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def identity(model: torch.nn.Module, cfg: Config, world_size: int) -> dict:
    """What a journal's results depend on: weights, every flag but RESULT_FREE, processes."""
    flags = {k: v for k, v in cfg.flags().items() if k not in RESULT_FREE}
    return {"weights": weights_digest(model), "flags": flags, "processes": world_size}


def differences(old: dict, new: dict) -> list[str]:
    """The parts of two identities that differ, named for a user: "weights", "--ttt_steps 60 -> 30", ...; a
    flag of `old` the suite has retired since is one too (what it did is not what runs now)."""
    out = ["weights"] if old.get("weights") != new["weights"] else []
    if old.get("processes") != new["processes"]:
        out.append(f"processes {old.get('processes')} -> {new['processes']}")
    flags = old.get("flags", {})
    out += [f"--{k} {flags.get(k)} -> {v}" for k, v in new["flags"].items() if flags.get(k) != v]
    return out + [f"--{k} {v} -> (retired)" for k, v in flags.items() if k not in new["flags"]]


def journal_paths(folder: Path, name: str, world_size: int) -> list[Path]:
    """Every process's journal of validation `name` in run folder `folder`, rank 0 first."""
    return [folder / "journal" / f"{name}.rank{rank}of{world_size}.jsonl" for rank in range(world_size)]


def open_journal(folder: Path, name: str, model: torch.nn.Module, cfg: Config, rank: int,
                 world_size: int) -> Journal | None:
    """This process's journal `<folder>/journal/<name>.rank<r>of<w>.jsonl` (None under --no-journal):
    a run with another number of processes shares its tasks out otherwise, and starts its own."""
    if not cfg.eval.journal:
        return None
    family = journal_paths(folder, name, world_size)
    return Journal(family[rank], identity(model, cfg, world_size), family)


def finished_attempts(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The attempts of every task a journal file holds (another process's, being written: a torn
    last line is left out) by episode index; none when the file does not exist yet."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_bytes().split(b"\n")[1:]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # the line its process is writing now
            continue
        if "task" in rec:
            out.update(_attempts(rec))
    return out


def _attempts(rec: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    return {int(key): tuple(np.asarray(a, dtype=np.int64) for a in pair["attempts"])
            for key, pair in rec["pairs"].items()}


class Journal:
    """One process's journal file: `done` maps each finished task id to its record (`record`);
    `heldout` is the held-out loss measured before the tasks (`write_heldout`; None until then);
    `spent` is the seconds of validation the file had recorded when it was opened (each line carries
    the seconds spent so far: a task's as it finishes, `note_time`'s at a stop)."""

    def __init__(self, path: Path, ident: dict, family: list[Path] | None = None):
        """`family`: every process's journal of this validation (this one alone by default)."""
        self.path = path
        self.done: dict[str, dict] = {}
        self.heldout: dict | None = None
        self.spent = 0.0
        self.opened = time.perf_counter()
        self.family = family or [path]
        if path.exists():
            self._read(ident)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write({"journal": 1, **ident})

    def _read(self, ident: dict) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        kept = len(data)
        if lines[-1]:  # no newline after the last line: torn mid-write
            kept -= len(lines[-1])
        lines = lines[:-1]
        records = []
        for n, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if n < len(lines):
                    raise ConfigError(f"{self.path}: line {n} is damaged; delete the file to validate from the "
                                      f"start") from None
                kept -= len(line) + 1  # the last complete-looking line did not parse: torn too
        if not records or records[0].get("journal") != 1:
            raise ConfigError(f"{self.path}: not a validation journal (no header); delete it or choose another "
                              f"--run_dir")
        changed = differences(records[0], ident)
        if changed:
            raise ConfigError(f"{self.path}: written by other weights or flags ({'; '.join(changed)}): delete it or "
                              f"choose another --run_dir")
        if kept < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(kept)
        self.done = {r["task"]: r for r in records[1:] if "task" in r}
        self.heldout = next((r for r in reversed(records[1:]) if "heldout" in r), None)  # the latest
        self.spent = max((r.get("spent", 0.0) for r in records[1:]), default=0.0)

    def elapsed(self) -> float:
        """Seconds of validation this journal has seen: before it was opened, and since."""
        return self.spent + time.perf_counter() - self.opened

    def append(self, record: dict) -> None:
        """Write one finished task's record (`record`) as a line, with the seconds spent so far, on
        disk before returning."""
        self._write({**record, "spent": round(self.elapsed(), 3)})
        self.done[record["task"]] = record

    def write_heldout(self, metrics: dict[str, float], pairs: dict, covers: int) -> None:
        """Write the held-out loss (`heldout/*` metrics and report.json's per-pair records) over the
        first `covers` evaluation tasks (0: all), with the seconds spent so far: a continuation that
        covers as many reads it back instead of measuring it again, and its deadline has counted its
        seconds once."""
        self.heldout = {"heldout": metrics, "pairs": pairs, "covers": covers}
        self._write({**self.heldout, "spent": round(self.elapsed(), 3)})

    def note_time(self) -> None:
        """A line of the seconds spent so far (a stop: the time since the last task counts too)."""
        self._write({"spent": round(self.elapsed(), 3)})

    def _write(self, line: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def record(task_id: str, episodes: list[int], scores: TaskScores) -> dict:
    """One task's line from `scores` (evaluation.scores.TaskScores): per test input (episode index)
    its attempts (grids as lists), pair metrics and the copy baseline's (None without a known
    output), held-out loss after adaptation (nats a cell, bits a grid; None when not measured)."""
    return {"task": task_id, "seconds": scores.seconds[task_id], "ttt_steps": scores.ttt_steps[task_id],
            "pairs": {str(i): {"attempts": [a.tolist() for a in scores.attempts[i]],
                               "metrics": scores.records[i][1] if i in scores.records else None,
                               "copy": scores.copy_records[i][1] if i in scores.copy_records else None,
                               "loss": list(scores.losses[i][1:]) if i in scores.losses else None}
                      for i in episodes}}


def restore(rec: dict, scores: TaskScores) -> None:
    """A journal line back into `scores` (the inverse of `record`)."""
    task_id = rec["task"]
    scores.seconds[task_id], scores.ttt_steps[task_id] = rec["seconds"], rec["ttt_steps"]
    scores.attempts.update(_attempts(rec))
    for key, pair in rec["pairs"].items():
        i = int(key)
        if pair["metrics"] is None:
            scores.unanswered.add(i)
        else:
            scores.records[i] = (task_id, pair["metrics"])
            scores.copy_records[i] = (task_id, pair["copy"])
        if pair["loss"] is not None:
            scores.losses[i] = (task_id, *pair["loss"])
