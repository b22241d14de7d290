"""Test-time training by task size (evaluation/ttt_policy.by_size): a small task, every grid known
before its test outputs at most SMALL_SIDE a side, takes --ttt_small_steps steps; the rest
--ttt_steps; a group never holds both (evaluate.process_groups)."""

import json
import shutil

import numpy as np
import pytest
import torch

from data.arc import ArcPair, ArcTask, DataError
from data.episodes import EpisodeDataset, evaluation_episodes
from engine.config import Config
from engine.errors import ConfigError
from evaluation.evaluate import episodes_by_task, first_tasks, process_groups, score_tasks
from evaluation.ttt_policy import SMALL_SIDE, by_size, of_size, size_class
from tests.test_adaptation import setup
from tests.test_task_batch import RULES, made_tasks
from training.build import build_data

CPU = torch.device("cpu")


def with_test_input(task: ArcTask, side: int) -> ArcTask:
    """`task` with its test pair's input `side` x `side` (its output left as it is)."""
    pair = task.test[0]
    return ArcTask(task.task_id, task.train, (ArcPair(np.zeros((side, side), dtype=np.int64), pair.output),))


def test_a_task_is_small_when_every_grid_known_before_its_test_outputs_fits():
    e = Config().eval
    small = made_tasks({"copy": RULES["copy"]}, side=SMALL_SIDE)[0]
    assert small.known_side == SMALL_SIDE and size_class(e, small) == "small"
    assert size_class(e, with_test_input(small, SMALL_SIDE + 1)) == "large"  # a test input counts
    huge_output = ArcTask("t", small.train, (ArcPair(small.test[0].input, np.zeros((30, 30), dtype=np.int64)),))
    assert size_class(e, huge_output) == "small"  # a test output is never read
    assert by_size(e, [small]) == {"ttt_steps": e.ttt_small_steps}
    assert by_size(e, [with_test_input(small, 12)]) == {}
    with pytest.raises(ValueError, match="two size classes"):
        by_size(e, [small, with_test_input(small, 12)])
    for off in (dict(ttt_small_steps=0), dict(ttt_steps=0)):  # the rule off; no adaptation at all
        cfg = Config.from_flags(**off).eval
        assert size_class(cfg, small) == "" and by_size(cfg, [small, with_test_input(small, 12)]) == {}


def test_eval_size_keeps_one_size_class_in_the_sets_order():
    """--eval_size (evaluation/ttt_policy.of_size): small and large split the tasks by their known
    grids, each in the set's order; all keeps every one."""
    small = made_tasks({"copy": RULES["copy"]}, side=SMALL_SIDE)[0]
    tasks = tuple(with_test_input(small, side) for side in (4, 12, SMALL_SIDE, 30))
    assert [t.known_side for t in of_size(tasks, "small")] == [SMALL_SIDE, SMALL_SIDE]  # the demos are 10 a side
    assert [t.known_side for t in of_size(tasks, "large")] == [12, 30]
    assert of_size(tasks, "all") == tasks


def test_small_tasks_take_every_one_of_their_steps_in_groups_of_their_own(small_cfg):
    """Four small and four large tasks adapted three at a time, their demos alike in side (one canvas a
    group would let them share one), the large ones large by their test inputs alone: the groups keep
    the classes apart, each small task takes --ttt_small_steps steps, each large one --ttt_steps."""
    cfg, state, eval_set, _ = setup(small_cfg, ttt_steps=2, ttt_small_steps=3, adapt_tasks=3, eval_augments=1,
                                    heldout_loss=False)
    small = made_tasks(RULES, side=SMALL_SIDE)
    large = [with_test_input(ArcTask(f"big-{t.task_id}", t.train, t.test), SMALL_SIDE + 2) for t in small]
    dataset = EpisodeDataset(evaluation_episodes(tuple(small + large)), eval_set.scale)
    ids = [t.task_id for t in small + large]
    groups = process_groups(dataset, episodes_by_task(dataset), ids, cfg, 1)[0]
    classes = [{t.task_id for t in small}, {t.task_id for t in large}]
    assert sorted(sum(groups, [])) == sorted(ids) and all(any(set(g) <= c for c in classes) for g in groups)
    scores = score_tasks(state.model, state.prompts, dataset, ids, cfg=cfg, device=CPU)
    assert {t.task_id: scores.ttt_steps[t.task_id] for t in small} == {t.task_id: 3 for t in small}
    assert {t.task_id: scores.ttt_steps[t.task_id] for t in large} == {t.task_id: 2 for t in large}


def test_eval_size_scores_one_class_and_refuses_what_it_cannot_mean(small_cfg, arc_folder, tmp_path):
    """--eval_size: every validation draws from that class alone, said at start-up; a class the set
    lacks is one data error, and a submission (which holds every task) is refused beside it."""
    folder = tmp_path / "mixed" / "evaluation"
    folder.mkdir(parents=True)
    kept = sorted((arc_folder / "evaluation").glob("*.json"))[:2]
    for f in kept:
        shutil.copy(f, folder / f.name)
    grid = np.zeros((SMALL_SIDE + 2, SMALL_SIDE + 2), dtype=int).tolist()
    (folder / "big.json").write_text(json.dumps({"train": [{"input": grid, "output": grid}] * 2,
                                                 "test": [{"input": grid, "output": grid}]}))
    for size, ids, said in (("large", ["big"], "1 large of 3"), ("small", [f.stem for f in kept], "2 small of 3"),
                            ("all", [*(f.stem for f in kept), "big"], "3")):
        data = build_data(small_cfg(eval_data=str(folder.parent), eval_size=size), CPU)
        assert sorted(first_tasks(data.eval_set, 0)) == sorted(ids) and data.evaluation == said, size
    with pytest.raises(DataError, match=r"^--eval_size large: none of the \d+ evaluation tasks of .+ is large$"):
        build_data(small_cfg(eval_size="large"), CPU)
    with pytest.raises(ConfigError, match="^--submission holds every evaluation task: it takes --eval_size all, "
                                          "not small$"):
        small_cfg(eval_size="small", submission=str(tmp_path / "submission.json"))


def test_the_flags_help_names_the_small_side_the_rule_uses():
    """engine/config.py cannot import the rule (evaluation sits above it), so its help says the side
    in words: it must be SMALL_SIDE's."""
    import dataclasses

    from engine.config import EvalCfg
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(EvalCfg)}
    for name in ("eval_size", "ttt_small_steps"):
        assert f"at most {SMALL_SIDE} a side" in helps[name], (name, helps[name])
