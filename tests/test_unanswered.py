"""Tasks to predict: a challenges file without solutions (or evaluation tasks without test outputs)
is predicted into a submission, never trained on, and scored only where an output is known."""

import json
import shutil

import pytest

import training
from data.arc import DataError
from data.sources import load_source
from tests.conftest import CPU


def challenges(tasks) -> dict:
    """ARC Prize's challenges form: demos with outputs, test inputs without."""
    return {t.task_id: {"train": [{"input": p.input.tolist(), "output": p.output.tolist()} for p in t.train],
                        "test": [{"input": p.input.tolist()} for p in t.test]} for t in tasks}


def is_grid(g) -> bool:
    return isinstance(g, list) and g and all(isinstance(r, list) and len(r) == len(g[0]) and r for r in g) and \
        all(isinstance(c, int) and 0 <= c <= 9 for r in g for c in r)


def check_submission(submission: dict, order: dict) -> None:
    """ARC Prize's format: every task of the challenges file in its order, every test input, two
    attempts of rectangular grids of colours 0-9."""
    assert list(submission) == list(order)
    for task_id, task in order.items():
        assert len(submission[task_id]) == len(task["test"])
        for entry in submission[task_id]:
            assert set(entry) == {"attempt_1", "attempt_2"}
            assert is_grid(entry["attempt_1"]) and is_grid(entry["attempt_2"])


def test_a_test_challenges_file_alone_loads_as_tasks_to_predict(arc_folder, tmp_path):
    tasks = load_source(str(arc_folder)).evaluation
    path = tmp_path / "arc-agi_test_challenges.json"
    path.write_text(json.dumps(challenges(tasks)))
    loaded = load_source(str(path))
    assert loaded.training == () and [t.task_id for t in loaded.evaluation] == [t.task_id for t in tasks]
    assert all(p.output is None for t in loaded.evaluation for p in t.test)
    assert all(p.output is not None for t in loaded.evaluation for p in t.train)  # demos keep theirs
    # the same file as training data: its answers are needed, and the line says which file is missing
    train = tmp_path / "arc-agi_training_challenges.json"
    train.write_text(path.read_text())
    with pytest.raises(DataError, match="arc-agi_training_solutions.json: cannot read"):
        load_source(str(train))
    # a demo without its output is an error in a task to predict too
    broken = challenges(tasks)
    del broken[tasks[0].task_id]["train"][0]["output"]
    path.write_text(json.dumps(broken))
    with pytest.raises(DataError, match=rf"task {tasks[0].task_id}: train\[0\]: missing key 'output'"):
        load_source(str(path))


def test_a_folder_whose_evaluation_tasks_lack_test_outputs_predicts_them(arc_folder, tmp_path):
    folder = tmp_path / "arc"
    shutil.copytree(arc_folder, folder)
    first = sorted((folder / "evaluation").glob("*.json"))[0]
    task = json.loads(first.read_text())
    for pair in task["test"]:
        del pair["output"]
    first.write_text(json.dumps(task))
    splits = load_source(str(folder))
    unanswered = {t.task_id: sum(not p.answered for p in t.test) for t in splits.evaluation}
    assert unanswered[first.stem] == len(task["test"]) and sum(unanswered.values()) == len(task["test"])
    some = sorted((folder / "training").glob("*.json"))[0]
    task = json.loads(some.read_text())
    del task["test"][0]["output"]
    some.write_text(json.dumps(task))
    with pytest.raises(DataError, match=rf"{some.stem}: test\[0\]: missing key 'output'"):
        load_source(str(folder))


def test_predicting_a_challenges_file_writes_the_submission_the_answers_cannot_change(small_cfg, arc_folder,
                                                                                      tmp_path):
    """The same weights predict the same attempts whether the answers are known or not; without
    them the run writes the submission in the challenges file's order, a report of attempts, and
    scores nothing."""
    run = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=2, val_every="end", eval_tasks=0,
                                   ttt_steps=2, submission=str(tmp_path / "answered.json")), CPU)
    tasks = load_source(str(arc_folder)).evaluation
    order = challenges(reversed(tasks))  # an order of its own: the submission must keep it
    path = tmp_path / "arc-agi_test_challenges.json"
    path.write_text(json.dumps(order))
    predicted = training.train(small_cfg(eval_only=True, resume=run["run_dir"], eval_data=str(path), eval_tasks=0,
                                         ttt_steps=2, run_dir=str(tmp_path / "predict"),
                                         submission=str(tmp_path / "submission.json")), CPU)
    submission = json.loads((tmp_path / "submission.json").read_text())
    check_submission(submission, order)
    answered = json.loads((tmp_path / "answered.json").read_text())
    assert {k: submission[k] for k in answered} == answered, "the answers changed an attempt"
    pairs = sum(len(t.test) for t in tasks)
    assert predicted["eval/unanswered"] == pairs and predicted["eval/pairs"] == 0
    assert "eval/pass2" not in predicted and "heldout/eval_pairs" not in predicted
    report = json.loads((tmp_path / "predict" / "report.json").read_text())
    assert all(c["runs"][0]["unanswered"] and all(t["target"] is None for t in c["tests"]) for c in report["cards"])
    assert len(report["cards"]) == len(tasks)
