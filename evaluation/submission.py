"""The ARC Prize submission file: complete and valid at every moment of a validation (docs/runs.md,
"A deadline"): the input as both attempts of every test input at first, then each scored group's attempts."""

from __future__ import annotations

import contextlib
import fcntl
import json
import tempfile
from pathlib import Path

from data.arc import Grid
from data.episodes import EpisodeDataset
from engine.errors import ConfigError
from engine.files import write_atomic
from evaluation.journal import finished_attempts


def submission_of(dataset: EpisodeDataset, attempts: dict[int, tuple[Grid, Grid]]) -> dict[str, list[dict]]:
    """Every task of `dataset` in its order (a challenges file's), every test input in order: its two
    attempts where `attempts` (by episode index) has them, else the input twice."""
    out: dict[str, list[dict]] = {}
    for i, ep in enumerate(dataset.episodes):
        a1, a2 = attempts.get(i, (ep.query.input, ep.query.input))
        out.setdefault(ep.task.task_id, []).append({"attempt_1": a1.tolist(), "attempt_2": a2.tolist()})
    return out


def check_submission_path(path: Path) -> None:
    """A ConfigError naming --submission when `path` cannot take the file (a folder; a file or an unwritable
    folder where its folder would be): checked at start-up, before a run writes or trains anything."""
    if path.is_dir():
        raise ConfigError(f"--submission {path}: a folder; name the file to write")
    folder = next(p for p in path.parents if p.exists())  # the nearest that exists: the rest are made
    if not folder.is_dir():
        raise ConfigError(f"--submission {path}: {folder} is a file, not a folder")
    # the file is replaced by a rename, so its folder is what is written: a file made there and removed
    # (permission bits say nothing to root, nor of a read-only or pseudo file system such as /proc)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(f"--submission {path}: {folder} is not writable ({err.strerror})") from None


class SubmissionFile:
    """`path`, written with the fallback attempts now and again on each `update`. With `journals` (every
    process's journal of this validation), each process writes it after each of its groups: the attempts of
    every task any journal holds, its own included, under a lock in the journals' folder (the run folder's:
    nothing beside the submission but itself) so that the last writer has read every journal line written
    before it; without journals the main process writes its own tasks."""

    def __init__(self, path: Path, dataset: EpisodeDataset, journals: list[Path] = ()):
        self.path, self.dataset, self.journals = path, dataset, list(journals)
        self.lock = self.journals[0].parent / "submission.lock" if self.journals else None
        path.parent.mkdir(parents=True, exist_ok=True)
        self.update({})

    def update(self, attempts: dict[int, tuple[Grid, Grid]]) -> None:
        with open(self.lock, "w") if self.lock else contextlib.nullcontext() as lock:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            merged = {i: a for journal in self.journals for i, a in finished_attempts(journal).items()}
            write_atomic(self.path, json.dumps(submission_of(self.dataset, {**merged, **attempts})))
