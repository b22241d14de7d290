"""RE-ARC as a training source (data/re_arc.py): its zip and its folder, strict validation with
oversized examples counted and left out, demo sets drawn per task, several sources in one --data,
and no RE-ARC task that is an evaluation task."""

import json
import zipfile

import numpy as np
import pytest
import torch

import training
from data.arc import DataError
from data.re_arc import DERIVED, demo_sets, load_pools, load_re_arc
from data.sources import ReArcOptions, load_source, load_splits
from tests.conftest import write_re_arc


def test_the_zip_and_its_folder_load_the_same_validated_examples(re_arc):
    folder, archive = re_arc
    from_zip, from_folder = load_pools(str(archive)), load_pools(str(folder.parent / "re_arc"))
    assert [p.task_id for p in from_zip] == [p.task_id for p in from_folder] and len(from_zip) == 8
    for a, b in zip(from_zip, from_folder, strict=True):
        assert len(a.examples) == len(b.examples) and a.oversized == b.oversized
        assert all(np.array_equal(x.input, y.input) and np.array_equal(x.output, y.output)
                   for x, y in zip(a.examples, b.examples, strict=True))
    assert [p.oversized for p in from_zip] == [1] + [0] * 7 and len(from_zip[0].examples) == 12


def test_a_bad_example_is_one_line_naming_the_file_and_the_pair(tmp_path):
    folder, _ = write_re_arc(tmp_path, ["aaa", "bbb"])
    examples = json.loads((folder / "tasks" / "bbb.json").read_text())
    examples[3]["output"][0][0] = 12
    (folder / "tasks" / "bbb.json").write_text(json.dumps(examples))
    with pytest.raises(DataError) as err:
        load_pools(str(folder))
    assert "tasks/bbb.json" in str(err.value) and "train[3].output: cell (0,0) is 12" in str(err.value)
    (folder / "tasks" / "bbb.json").write_text("{not json")
    with pytest.raises(DataError, match="tasks/bbb.json: not valid JSON"):
        load_pools(str(folder))
    with pytest.raises(DataError, match="neither RE-ARC's re_arc.zip nor a folder"):
        load_pools(str(tmp_path / "nowhere"))


def test_demo_sets_are_distinct_examples_drawn_per_task_by_the_seed(re_arc):
    pools = load_pools(str(re_arc[1]))
    sets = demo_sets(pools[1], sets=5, demos=3, seed=0)
    assert [t.task_id for t in sets] == [f"{pools[1].task_id}{DERIVED}{k}" for k in range(5)]
    assert all(t.family == pools[1].task_id and len(t.train) == 3 and len(t.test) == 1 for t in sets)
    index = {(p.input.tobytes(), p.input.shape): i for i, p in enumerate(pools[1].examples)}
    drawn = [[index[(p.input.tobytes(), p.input.shape)] for p in t.train + t.test] for t in sets]
    assert all(len(set(d)) == 4 for d in drawn) and len({tuple(d) for d in drawn}) == 5
    def first_inputs(tasks):
        return [t.train[0].input for t in tasks]

    again, other = (demo_sets(pools[1], sets=5, demos=3, seed=seed) for seed in (0, 1))
    assert all(map(np.array_equal, first_inputs(sets), first_inputs(again)))
    assert not all(map(np.array_equal, first_inputs(sets), first_inputs(other)))
    assert len(demo_sets(pools[1], sets=2, demos=12, seed=0)) == 0  # 12 examples: not 12 demos + 1 query


def test_several_sources_in_one_data_flag(arc_folder, re_arc):
    tasks, line = load_re_arc(str(re_arc[1]), sets=4, demos=3, seed=0)
    assert len(tasks) == 32 and "8 tasks, 96 examples -> 32 training tasks" in line
    assert "left out: 1 examples with a grid over 30x30" in line
    both = load_source(f"{arc_folder},re-arc:{re_arc[1]}", re_arc=ReArcOptions(sets=4))
    alone = load_source(str(arc_folder))
    def ids(tasks):
        return [t.task_id for t in tasks]

    assert ids(both.training) == ids(alone.training) + ids(tasks) and ids(both.evaluation) == ids(alone.evaluation)
    assert both.notes == (line,)
    with pytest.raises(DataError, match="is in .* and in .*: name each source once"):
        load_source(f"{arc_folder},{arc_folder}")


def test_a_re_arc_task_that_is_an_evaluation_task_is_refused(arc_folder, tmp_path):
    evaluation = sorted(f.stem for f in (arc_folder / "evaluation").glob("*.json"))
    _, archive = write_re_arc(tmp_path, ["notaneval", evaluation[0]])
    data = f"{arc_folder},re-arc:{archive}"
    with pytest.raises(DataError, match=rf"share 1 task ids \(e.g. {evaluation[0]}\).*--drop_overlap"):
        load_splits(data)
    kept = load_splits(data, drop_overlap=True).training
    assert {t.family_id for t in kept} & set(evaluation) == set()
    assert any(t.family == "notaneval" for t in kept)


def test_a_run_on_arc_and_re_arc_says_what_was_left_out_and_trains(arc_folder, re_arc, small_cfg, capsys):
    summary = training.train(small_cfg(data=f"{arc_folder},re-arc:{re_arc[1]}", re_arc_sets=2, max_batches=2),
                             torch.device("cpu"))
    assert summary["steps"] == 2
    err = capsys.readouterr().err
    assert "8 training, 3 evaluation tasks" not in err and "24 training, 3 evaluation tasks" in err
    assert "left out: 1 examples with a grid over 30x30, 0 tasks with too few examples" in err


def test_a_zip_without_tasks_is_refused(tmp_path):
    archive = tmp_path / "re_arc.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("re_arc/metadata.json", "{}")
    with pytest.raises(DataError, match="no task files"):
        load_pools(str(archive))


def test_a_task_and_its_re_arc_demo_sets_share_one_task_embedding_row(arc_folder, re_arc, small_cfg):
    """ARC-AGI-1's task <id> and RE-ARC's <id>~0, <id>~1 are one rule: one embedding row, so the
    embedding has a row per task (8 training + 3 evaluation demos), not per demo set (8 + 16 + 3)."""
    cfg = small_cfg(data=f"{arc_folder},re-arc:{re_arc[1]}", re_arc_sets=2, task_embedding=True,
                    train_on_eval_demos=True)
    data = training.build_data(cfg, torch.device("cpu"))
    rows = data.loader.dataset.task_rows
    assert len(data.task_ids) == 8 + 3 and sorted(set(rows.values())) == list(range(11))
    for task in data.splits.training:
        assert rows[task.task_id] == data.task_ids.index(task.family_id)
    assert any(DERIVED in t for t in rows) and len(rows) == 8 + 16 + 3
