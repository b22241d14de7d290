"""The held-out loss (evaluation/heldout.py): its definition worked by hand, its two routes agreeing,
and that it reads test outputs without changing an attempt or a weight (the random streams:
tests/test_validation.py's test of validate(), which measures it)."""

import dataclasses
import math

import numpy as np
import torch

import training
from data.arc import ArcPair
from data.canvas import EOG, NUM_CLASSES
from data.episodes import EpisodeDataset, evaluation_episodes
from evaluation.evaluate import candidates, evaluate, first_tasks
from evaluation.heldout import adapted_losses, heldout_losses, loss_metrics, pair_losses, target_fitted
from tests.test_evaluation import eval_setup
from training.validation import heldout_task_count

CPU = torch.device("cpu")


class ColourZeroAgent(torch.nn.Module):
    """A real agent with hand-chosen logits: class 0 at ln 3, the other 11 at 0, on every cell. So
    p(0) = 3/14 and p(c) = 1/14 for any other class, an end-of-grid marker included."""

    num_blocks, channels, num_views = 0, 1, 0

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(NUM_CLASSES))

    def forward(self, canvas, prompt, adapter=None, enclosed=None):
        logits = torch.zeros(*canvas.shape, NUM_CLASSES) + self.bias + 0 * prompt.sum()
        logits[..., 0] += math.log(3)
        return logits


def hand_loss(grid: np.ndarray) -> tuple[float, float]:
    """(nats a cell, bits a grid) of `grid` under ColourZeroAgent, written out: its h*w cells and its
    h + w + 1 end-of-grid markers, each colour-0 cell -ln(3/14), any other -ln(1/14)."""
    h, w = grid.shape
    zeros = int((grid == 0).sum())
    cells = h * w + h + w + 1
    nats = zeros * math.log(14 / 3) + (cells - zeros) * math.log(14)
    return nats / cells, nats / math.log(2)


def test_the_definition_worked_by_hand(small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path)
    state.model.agent = ColourZeroAgent()
    episodes = list(range(len(eval_set)))
    losses = pair_losses(state.model, state.prompts, target_fitted(eval_set), episodes, views=1, cfg=cfg, device=CPU)
    for i, (task, nats, bits) in losses.items():
        want = hand_loss(eval_set.episodes[i].query.output)
        assert task == eval_set.episodes[i].task.task_id
        assert math.isclose(nats, want[0], rel_tol=1e-5) and math.isclose(bits, want[1], rel_tol=1e-5)
    metrics = loss_metrics(losses, "x")
    want = np.mean([hand_loss(eval_set.episodes[i].query.output)[0] for i in episodes])
    assert math.isclose(metrics["x_nats_cell"], want, rel_tol=1e-5) and metrics["x_pairs"] == len(episodes)
    assert metrics["x_nats_cell_lo"] <= metrics["x_nats_cell"] <= metrics["x_nats_cell_hi"]
    # a one-cell grid by hand: colour 0 and its three markers, -(ln 3/14 + 3 ln 1/14) / 4 nats a cell
    assert math.isclose(hand_loss(np.zeros((1, 1), dtype=np.int64))[0],
                        -(math.log(3 / 14) + 3 * math.log(1 / 14)) / 4)
    assert EOG != 0  # the markers are "any other class" above


def test_the_views_log_probabilities_give_the_same_loss_as_a_forward_on_fitted_canvases(small_cfg, tmp_path):
    """After adaptation the loss of a pair whose output lies within its predicted extent is read from
    the candidates' views; it must equal the forward on the target-fitted canvases it stands for. A
    pair whose output is larger than predicted takes the forward (its canvases differ)."""
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, eval_augments=4)
    state.model.train(False)
    fitted = target_fitted(eval_set)
    episodes = list(range(len(eval_set)))
    same = [i for i in episodes if fitted.extents[i] == eval_set.extents[i]]
    assert same, "the check needs pairs whose output fits the predicted extent"
    cands = candidates(state.model, state.prompts, eval_set, episodes, cfg=cfg, device=CPU)
    from_views = adapted_losses(state.model, state.prompts, eval_set, fitted, cands, episodes, cfg=cfg, device=CPU,
                                adapted=None)
    forward = pair_losses(state.model, state.prompts, fitted, episodes, views=4, cfg=cfg, device=CPU)
    assert from_views.keys() == forward.keys()
    for i in episodes:
        assert math.isclose(from_views[i][1], forward[i][1], rel_tol=1e-4), i


def with_outputs(eval_set: EpisodeDataset, change) -> EpisodeDataset:
    tasks = {ep.task.task_id: dataclasses.replace(ep.task, test=tuple(ArcPair(p.input, change(p.output))
                                                                      for p in ep.task.test))
             for ep in eval_set.episodes}
    return EpisodeDataset(evaluation_episodes(tuple(tasks.values())), eval_set.scale, canvas=eval_set.canvas,
                          fit_target=False, task_rows=eval_set.task_rows)


def test_it_reads_test_outputs_and_changes_no_attempt_or_weight(small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, ttt_steps=3)
    weights = {k: v.clone() for k, v in state.model.state_dict().items()}
    first = evaluate(state.model, state.prompts, eval_set, cfg=cfg, device=CPU)
    before, _ = heldout_losses(state.model, state.prompts, {"eval": eval_set}, cfg=cfg, device=CPU)
    assert all(torch.equal(v, state.model.state_dict()[k]) for k, v in weights.items())
    # other outputs, one of them larger than any demo (the fitted canvas grows): other losses, same attempts
    changed = with_outputs(eval_set, lambda out: np.full((out.shape[0] + 3, out.shape[1]), 7))
    second = evaluate(state.model, state.prompts, changed, cfg=cfg, device=CPU)
    after, _ = heldout_losses(state.model, state.prompts, {"eval": changed}, cfg=cfg, device=CPU)
    assert second.submission == first.submission
    assert before["heldout/eval_nats_cell"] != after["heldout/eval_nats_cell"]
    assert first.metrics["eval/adapted_nats_cell"] != second.metrics["eval/adapted_nats_cell"]
    assert all(torch.equal(v, state.model.state_dict()[k]) for k, v in weights.items())


def test_a_run_logs_it_at_every_validation_and_saves_it(small_cfg, tmp_path):
    import json

    from tests.test_validation import scalars
    summary = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=4, val_every="2", val_share=1e9,
                                       val_tasks=1, eval_tasks=1, ttt_steps=1, hold_out_tests=3, heldout_tasks=0), CPU)
    tags = scalars(summary["run_dir"])
    assert [s for s, _ in tags["heldout/eval_nats_cell"]] == [2, 4]
    assert [s for s, _ in tags["heldout/train_tests_nats_cell"]] == [2, 4]
    minutes = [m for _, m in tags["heldout/train_minutes"]]
    assert 0 < minutes[0] < minutes[1] <= summary["train_seconds"] / 60 + 0.01
    n_eval = len(training.build_data(small_cfg(), CPU).eval_set)
    assert summary["heldout/eval_pairs"] == n_eval and summary["heldout/train_tests_pairs"] >= 3
    assert summary["eval/adapted_nats_cell"] > 0 and "eval/pass2_lo" in summary and "eval/task_score_hi" in summary
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert len(report["heldout"]["eval"]) == n_eval
    rows = dict(report["header"]["rows"])
    assert "95%" in rows["pass@2"] and "nats a cell" in rows["held-out loss before adaptation: eval"]
    assert all("nats_cell" in p for c in report["cards"] for p in c["runs"][0]["pairs"])
    # resumed, the run's training minutes go on from where they were (Counters.train_seconds)
    training.train(small_cfg(run_dir=str(tmp_path / "run"), resume=str(tmp_path / "run"), epochs=2, max_batches=4,
                             val_every="2", val_share=1e9, val_tasks=1, eval_tasks=1, ttt_steps=1, hold_out_tests=3),
                   CPU)
    later = [m for s, m in scalars(summary["run_dir"])["heldout/train_minutes"] if s > 4]
    assert minutes[1] < later[0] < later[1]


def test_a_stop_ends_it_within_a_batch(small_cfg, tmp_path):
    """Validation stops within seconds: the held-out loss reads the stop between batches and raises
    Interrupted once every process has seen it (a run's validation of 400 tasks takes 25 s)."""
    import pytest

    from engine.loop import Interrupted
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, eval_batch_size=1)
    batches = []
    state.model.agent.register_forward_hook(lambda *_: batches.append(1))
    fitted = target_fitted(eval_set)
    done = pair_losses(state.model, state.prompts, fitted, list(range(len(fitted))), views=1, cfg=cfg, device=CPU,
                       stop=lambda: len(batches) >= 1)  # true once the first batch is through
    assert len(done) == 1 < len(fitted), "the pair of the first batch, no other"
    with pytest.raises(Interrupted):
        heldout_losses(state.model, state.prompts, {"eval": eval_set}, cfg=cfg, device=CPU, stop=lambda: True)
    batches.clear()  # what was measured before the stop travels with it (a stopped run logs it, its pairs counted)
    with pytest.raises(Interrupted) as stopped:
        heldout_losses(state.model, state.prompts, {"eval": eval_set}, cfg=cfg, device=CPU,
                       stop=lambda: len(batches) >= 1)
    assert stopped.value.partial["heldout/eval_pairs"] == 1 and "heldout/eval_nats_cell" in stopped.value.partial


def test_a_stop_is_read_between_qwens_forwards(small_cfg, tmp_path):
    """A batch whose demos Qwen encodes for a minute (a real-sized Qwen on the CPU) is left between two
    forwards when the stop comes: no pair of it is kept, and the encoder reads no stop after."""
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path, eval_batch_size=64, qwen_encode_batch=1)
    forwards = []
    state.model.qwen.trunk.register_forward_hook(lambda *_: forwards.append(1))
    fitted = target_fitted(eval_set)
    done = pair_losses(state.model, state.prompts, fitted, list(range(len(fitted))), views=1, cfg=cfg, device=CPU,
                       stop=lambda: len(forwards) >= 2)
    assert done == {} and len(forwards) == 2, "one batch, stopped after two of its demo texts"
    assert state.model.qwen.stop is None
    every = pair_losses(state.model, state.prompts, fitted, list(range(len(fitted))), views=1, cfg=cfg, device=CPU)
    assert len(every) == len(fitted) and len(forwards) > 3, "the batch had more demo texts to encode"


def test_heldout_tasks_chooses_what_the_loss_before_adaptation_covers(small_cfg, tmp_path, capsys):
    """--heldout_tasks N: the first N evaluation tasks' pairs (0: all); -1: all without Qwen or on a
    GPU, the validation's own tasks with a Qwen (tiny or real-sized) on a CPU. The main process shows a bar."""
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path)
    tasks = list(dict.fromkeys(ep.task.task_id for ep in eval_set.episodes))
    pairs_of = {t: sum(ep.task.task_id == t for ep in eval_set.episodes) for t in tasks}
    for n in (1, 0):
        covered = {"eval": set(first_tasks(eval_set, heldout_task_count(cfg.replace(heldout_tasks=n), CPU, 3)))}
        metrics, _ = heldout_losses(state.model, state.prompts, {"eval": eval_set}, cfg=cfg, device=CPU,
                                    tasks=covered, progress=True)
        assert metrics["heldout/eval_pairs"] == (pairs_of[tasks[0]] if n == 1 else sum(pairs_of.values()))
    assert "held-out loss, eval" in capsys.readouterr().err
    real = cfg.replace(qwen_model="random:Qwen/Qwen2.5-0.5B")
    assert heldout_task_count(cfg, CPU, 2) == 2 and heldout_task_count(real, CPU, 2) == 2
    assert heldout_task_count(cfg.replace(use_qwen=False), CPU, 2) == 0
    assert heldout_task_count(real, torch.device("cuda"), 2) == 0
    assert heldout_task_count(real.replace(heldout_tasks=0), CPU, 2) == 0
