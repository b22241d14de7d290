"""The attempt chooser: its features, its REINFORCE, its file in a checkpoint and its stage (--train_chooser)."""

import json
import shutil

import numpy as np
import pytest
import torch

import training
from data.arc import ArcPair
from data.augment import Augmentation
from engine.checkpoint import CHOOSER_FILE, add_to_checkpoint, checked_file, find_checkpoint
from engine.config import Config
from engine.errors import ConfigError
from engine.loop import summary_line
from evaluation.choice import FEATURES, AttemptChooser, candidate_features, expected_shapes, plackett_luce_two
from evaluation.scoring import Candidates, pick_two
from tests.conftest import write_re_arc
from training.chooser import fit, gathered_file, ranking_hits, with_generated_queries

CPU = torch.device("cpu")


def pair(h, w, oh, ow, colour=1):
    return ArcPair(np.full((h, w), colour), np.full((oh, ow), colour))


def test_expected_shapes_follow_the_demos():
    query = np.zeros((4, 6), int)
    assert expected_shapes((pair(2, 2, 2, 2), pair(3, 5, 3, 5)), query) == {(4, 6)}  # the input's shape
    assert expected_shapes((pair(2, 2, 3, 3), pair(4, 5, 3, 3)), query) == {(3, 3)}  # one output shape
    assert expected_shapes((pair(2, 2, 4, 6), pair(3, 1, 6, 3)), query) == {(8, 18)}  # twice the rows, 3x the columns
    assert expected_shapes((pair(2, 2, 1, 5), pair(3, 3, 4, 2)), query) is None


def test_candidate_features_rows_follow_the_votes():
    demos = (pair(2, 2, 2, 2, colour=3),)
    query = np.array([[0, 3], [3, 0]])
    cands = Candidates()
    a, b = np.array([[3, 3], [3, 3]]), np.array([[5]])
    for grid in (a, a, b):
        cands.add(grid, -0.5, Augmentation(), np.zeros((4, 4, 12), np.float32))
    grids, features = candidate_features(cands, demos, query)
    assert [g.tolist() for g in grids] == [a.tolist(), b.tolist()]
    assert features.shape == (2, len(FEATURES)) and features.dtype == np.float32
    row = dict(zip(FEATURES, features[1], strict=True))
    assert row["vote_share"] == pytest.approx(1 / 3) and row["votes_rank"] == 0.5
    assert row["shape_follows"] == 0.0 and row["colours_known"] == 0.0 and row["differs_from_first"] == 1.0
    assert dict(zip(FEATURES, features[0], strict=True))["shape_follows"] == 1.0


def synthetic_sets(n, rng):
    """Candidate sets whose hit is the one candidate marked in feature 'proposed', never the votes' first two."""
    sets = []
    for _ in range(n):
        size = int(rng.integers(4, 9))
        features = rng.normal(size=(size, len(FEATURES))).astype(np.float32)
        features[:, FEATURES.index("proposed")] = 0.0
        features[:, FEATURES.index("votes_rank")] = 1 / (1 + np.arange(size))  # rows in the votes' order
        hit = int(rng.integers(2, size))
        features[hit, FEATURES.index("proposed")] = 1.0
        hits = np.zeros(size, bool)
        hits[hit] = True
        sets.append((features, hits))
    return sets


def test_reinforce_learns_the_choice_the_reward_points_to():
    rng = np.random.default_rng(0)
    tasks = {f"t{i}": [s] for i, s in enumerate(synthetic_sets(60, rng))}
    chooser, figures = fit(tasks, Config.from_flags(chooser_epochs=150, chooser_lr=3e-2))
    assert figures["chooser/pass2_votes"] == 0.0 and figures["chooser/with_output"] == 60
    fresh = synthetic_sets(100, rng)  # never seen: the chooser learned the feature, not the sets
    assert np.mean([h[list(chooser.best_two(f))].any() for f, h in fresh]) > 0.9


def test_fit_refuses_when_no_input_holds_its_output():
    features = np.zeros((3, len(FEATURES)), np.float32)
    with pytest.raises(ConfigError, match="none of the 2 held-out test inputs"):
        fit({"a": [(features, np.zeros(3, bool))] * 2}, Config())


def test_chooser_file_round_trip_and_checksum(tmp_path, small_cfg):
    cfg = small_cfg(max_batches=1)
    training.train(cfg, CPU)
    checkpoint = find_checkpoint(cfg.run.run_dir)
    assert checked_file(checkpoint, CHOOSER_FILE) is None
    chooser = AttemptChooser(FEATURES, votes_prior=3.0)
    torch.nn.init.normal_(chooser.net[-1].weight)  # a trained chooser's last layer is not zero
    add_to_checkpoint(checkpoint, CHOOSER_FILE, lambda p: chooser.save(p, {"note": "test"}))
    assert find_checkpoint(str(checkpoint)) == checkpoint  # its checksum recorded: the folder is intact
    loaded = AttemptChooser.load(checked_file(checkpoint, CHOOSER_FILE), FEATURES)
    x = torch.rand(5, len(FEATURES)) + 0.1  # votes_rank in (0, 1] as candidate_features makes it
    assert loaded.votes_prior == 3.0 and torch.equal(loaded.scores(x), chooser.scores(x))
    with pytest.raises(ValueError, match=f"{CHOOSER_FILE}: the chooser reads features"):
        AttemptChooser.load(checkpoint / CHOOSER_FILE, FEATURES[:-1])
    (checkpoint / CHOOSER_FILE).write_bytes(b"damaged")
    with pytest.raises(ConfigError, match="does not match its checksum"):
        find_checkpoint(str(checkpoint))


def test_a_chooser_file_outside_the_checksums_is_refused(tmp_path, small_cfg):
    cfg = small_cfg(max_batches=1)
    training.train(cfg, CPU)
    checkpoint = find_checkpoint(cfg.run.run_dir)
    AttemptChooser(FEATURES).save(checkpoint / CHOOSER_FILE, {})  # written, but a stop came before its checksum
    with pytest.raises(ConfigError, match="not in the checkpoint's checksums"):
        checked_file(checkpoint, CHOOSER_FILE)


def test_learned_ranking_is_refused_where_no_chooser_can_be():
    with pytest.raises(ConfigError, match="--attempt_ranking learned needs a checkpoint's attempt chooser"):
        Config.from_flags(attempt_ranking="learned")
    with pytest.raises(ConfigError, match="two commands"):
        Config.from_flags(eval_only=True, train_chooser=True)


def test_the_stage_needs_held_out_pairs(small_cfg):
    cfg = small_cfg(max_batches=1)
    training.train(cfg, CPU)
    with pytest.raises(ConfigError, match="--hold_out_tests 0: no training test pair is left unseen"):
        training.train(cfg.replace(train_chooser=True, resume=cfg.run.run_dir), CPU)
    held = small_cfg(max_batches=1, hold_out_tests=2, run_dir=cfg.run.run_dir + "-held")
    training.train(held, CPU)
    with pytest.raises(ConfigError, match="--hold_out_tests 3: the run held out only 2"):
        training.train(held.replace(train_chooser=True, resume=held.run.run_dir, hold_out_tests=3), CPU)


@pytest.mark.slow
def test_stage_gathers_held_out_pairs_only_resumes_and_saves_a_chooser_eval_only_uses(small_cfg, arc_folder):
    """The whole stage on a small run: it gathers every held-out test input (and reads no evaluation
    task), resumes from what it gathered, trains, saves, and --eval_only ranks with the chooser.
    A run this small never has a held-out output among its candidates, so the test adds, in the
    gathered file, inputs whose candidates hold it (what a real run gathers), and says so."""
    cfg = small_cfg(max_batches=2, hold_out_tests=3)
    training.train(cfg, CPU)
    checkpoint = find_checkpoint(cfg.run.run_dir)
    stage = cfg.replace(train_chooser=True, resume=cfg.run.run_dir, chooser_epochs=20, enumerate=4)
    with pytest.raises(ConfigError, match="has its output among the candidates"):
        training.train(stage, CPU)
    saved = torch.load(gathered_file(checkpoint), weights_only=False)
    data = training.build_data(cfg, CPU)
    assert sorted(saved["tasks"]) == sorted(t.task_id for t in data.held_out)
    assert sum(map(len, saved["tasks"].values())) == sum(len(t.test) for t in training.build_data(
        cfg.replace(hold_out_tests=0), CPU).splits.training[:3])
    for rows in saved["tasks"].values():
        for features, hits in rows:
            assert features.shape == (len(hits), len(FEATURES)) and features.dtype == np.float32

    rng = np.random.default_rng(1)
    saved["tasks"]["with-output"] = synthetic_sets(20, rng)
    torch.save(saved, gathered_file(checkpoint))
    summary = training.train(stage, CPU)  # resumes: nothing left to gather, trains on what is there
    assert summary["chooser/with_output"] == 20 and checked_file(checkpoint, CHOOSER_FILE) is not None
    gathered_at = gathered_file(checkpoint).stat().st_mtime_ns
    # trained again with other training flags: what was gathered is read, not gathered again
    again = training.train(stage.replace(chooser_epochs=5, chooser_votes_prior=0.0), CPU)
    assert summary_line(again).endswith(f"run {checkpoint}")  # the line fixed.py prints
    assert gathered_file(checkpoint).stat().st_mtime_ns == gathered_at

    result = training.train(cfg.replace(eval_only=True, resume=cfg.run.run_dir, run_dir=cfg.run.run_dir + "-eval",
                                        attempt_ranking="learned", enumerate=4), CPU)
    assert "eval/pass2_learned" in result and 0.0 <= result["eval/pass2"] <= result["eval/oracle"]


@pytest.mark.slow
def test_the_stage_reads_no_evaluation_output(small_cfg, arc_folder, tmp_path):
    """Every evaluation test output changed (--eval_data a copy of the tasks whose evaluation test
    outputs are all 7s): the stage gathers the same features and hits, to the last bit."""
    changed = tmp_path / "changed"
    shutil.copytree(arc_folder, changed)
    for path in (changed / "evaluation").glob("*.json"):
        task = json.loads(path.read_text())
        for test in task["test"]:
            test["output"] = [[7] * len(test["output"][0])] * len(test["output"])
        path.write_text(json.dumps(task))
    cfg = small_cfg(max_batches=1, hold_out_tests=2)
    training.train(cfg, CPU)
    checkpoint = find_checkpoint(cfg.run.run_dir)
    gathered = []
    for eval_data in (str(arc_folder), str(changed)):
        gathered_file(checkpoint).unlink(missing_ok=True)
        with pytest.raises(ConfigError, match="has its output among the candidates"):
            training.train(cfg.replace(train_chooser=True, resume=cfg.run.run_dir, eval_data=eval_data), CPU)
        gathered.append(torch.load(gathered_file(checkpoint), weights_only=False)["tasks"])
    assert gathered[0].keys() == gathered[1].keys()
    for task_id, rows in gathered[0].items():
        for (f0, h0), (f1, h1) in zip(rows, gathered[1][task_id], strict=True):
            assert np.array_equal(f0, f1) and np.array_equal(h0, h1)


def test_generated_queries_are_refused_where_training_saw_re_arc_or_re_arc_lacks_the_tasks(small_cfg, re_arc, tmp_path):
    cfg = small_cfg(hold_out_tests=2, chooser_re_arc=str(re_arc[1]))
    held = training.build_data(cfg, CPU).held_out
    assert [len(t.test) for t in with_generated_queries(held, cfg)] == [len(t.test) + 4 for t in held]
    on_re_arc = cfg.replace(data=f"{cfg.data.data},re-arc:{re_arc[1]}")
    with pytest.raises(ConfigError, match="the run trained on RE-ARC"):
        with_generated_queries(held, on_re_arc)
    other, _ = write_re_arc(tmp_path, ["not-a-held-out-task"])
    with pytest.raises(ConfigError, match="none of the 2 held-out tasks"):
        with_generated_queries(held, cfg.replace(chooser_re_arc=str(other)))


@pytest.mark.slow
def test_the_stage_gathers_generated_queries_of_the_held_out_tasks(small_cfg, re_arc):
    """--chooser_re_arc: each held-out task's inputs are its test pairs and --chooser_queries generated
    pairs, gathered under a key that names them (the same stage without them gathers again)."""
    cfg = small_cfg(max_batches=1, hold_out_tests=2)
    training.train(cfg, CPU)
    checkpoint = find_checkpoint(cfg.run.run_dir)
    held = training.build_data(cfg, CPU).held_out
    for queries in (3, 0):
        stage = cfg.replace(train_chooser=True, resume=cfg.run.run_dir, chooser_epochs=5, chooser_re_arc=str(re_arc[1]),
                            chooser_queries=queries)
        try:
            training.train(stage, CPU)
        except ConfigError as err:  # a run this small seldom has an output among its candidates
            assert "has its output among the candidates" in str(err)
        gathered = torch.load(gathered_file(checkpoint), weights_only=False)
        assert gathered["key"]["chooser_queries"] == queries
        assert {t: len(rows) for t, rows in gathered["tasks"].items()} == {t.task_id: len(t.test) + queries
                                                                           for t in held}


def test_cross_validation_scores_each_fold_with_a_chooser_that_never_saw_it():
    """The figures of inputs of unseen tasks: a feature that points to the answer in every task carries
    to the folds held out (near the fit); the votes' two hold none of these hits."""
    rng = np.random.default_rng(2)
    tasks = {f"t{i}": [s] for i, s in enumerate(synthetic_sets(60, rng))}
    _, figures = fit(tasks, Config.from_flags(chooser_epochs=150, chooser_lr=3e-2))
    assert figures["chooser/pass2_votes"] == 0.0 and figures["chooser/pass2_cv"] > 0.8
    # answers marked at random (no feature says where): what one fold learns cannot carry to another
    noise = {t: [(np.where(np.arange(len(FEATURES)) == FEATURES.index("votes_rank"), f,
                           rng.normal(size=f.shape)).astype(np.float32), h)] for t, [(f, h)] in tasks.items()}
    _, figures = fit(noise, Config.from_flags(chooser_epochs=150, chooser_lr=3e-2))
    assert figures["chooser/pass2_cv"] < 0.6 < figures["chooser/pass2_fit"]
    _, single = fit({"one": tasks["t0"] * 3}, Config.from_flags(chooser_epochs=5))
    assert "chooser/pass2_cv" not in single  # one task: nothing to hold out


def test_the_batched_draws_are_two_plackett_luce_draws_without_replacement():
    """The Gumbel top-2 draw of AttemptChooser.update against the exact probabilities of drawing i,
    then j from what i left; padding (-inf) is never drawn first."""
    logits = torch.tensor([0.0, 1.0, -1.0, 0.5, float("-inf")])
    draws = plackett_luce_two(logits.expand(200_000, -1), torch.Generator().manual_seed(0))
    p = logits.softmax(-1)
    for i in range(4):
        for j in range(4):
            if i != j:
                exact = (p[i] * p[j] / (1 - p[i])).item()
                seen = ((draws[:, 0] == i) & (draws[:, 1] == j)).float().mean().item()
                assert seen == pytest.approx(exact, abs=0.005)
    assert (draws[:, 0] != 4).all() and (draws[:, 1] != 4).all()


def test_the_chooser_starts_as_the_votes_ranking():
    """With a votes prior (--chooser_votes_prior) and the MLP's last layer at zero, an untrained
    chooser's two best are the votes' two (rows come in the votes' order), whatever else it reads."""
    rng = np.random.default_rng(3)
    chooser = AttemptChooser(FEATURES, votes_prior=2.0)
    for f, _ in synthetic_sets(20, rng):
        assert chooser.best_two(f) == (0, 1)
    with pytest.raises(ValueError, match="reads the feature votes_rank"):
        AttemptChooser(("vote_share",), votes_prior=1.0)


def test_the_rankings_figures_read_the_features_as_the_candidates_rank():
    """votes: the first two rows; logprob: the two best logprob_rank; hedged: the votes' first and the
    logprob's first (the votes' second when they agree), as Candidates.attempts picks them."""
    def one(logprob_order, hit):
        f = np.zeros((4, len(FEATURES)), np.float32)
        f[:, FEATURES.index("logprob_rank")] = 1 / (1 + np.argsort(logprob_order))
        h = np.zeros(4, bool)
        h[hit] = True
        return torch.from_numpy(f), torch.from_numpy(h)

    # logprob ranks row 3 first, then row 2: votes miss, logprob and hedged find row 3
    assert ranking_hits([one([3, 2, 0, 1], 3)]) == {"votes": 0.0, "logprob": 1.0, "hedged": 1.0}
    # logprob agrees on row 0 first: hedged takes the votes' second (row 1), logprob its second (row 2)
    assert ranking_hits([one([0, 2, 1, 3], 1)]) == {"votes": 1.0, "logprob": 0.0, "hedged": 1.0}


def test_the_ranking_rules_have_one_copy():
    """scoring.pick_two: the rule Candidates.attempts and ranking_hits both apply."""
    assert pick_two("votes", ["a", "b", "c"], ["c", "a", "b"]) == ("a", "b")
    assert pick_two("logprob", ["a", "b", "c"], ["c", "a", "b"]) == ("c", "a")
    assert pick_two("hedged", ["a", "b", "c"], ["c", "a", "b"]) == ("a", "c")
    assert pick_two("hedged", ["a", "b", "c"], ["a", "c", "b"]) == ("a", "b")  # they agree: the votes' second
    assert pick_two("hedged", ["a"], ["a"]) == ("a", "a")  # one candidate: both attempts
