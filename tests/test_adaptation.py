"""Per-task adaptation: an untrained adapter changes nothing, rows of a batched adapter learn
independently, the view-start search keeps a start that sizes the demos right, and test-time
training restores the weights it trained."""

from pathlib import Path

import numpy as np
import pytest
import torch

import training
from agents.views import NUM_VIEWS, views_fitting
from data.arc import ArcPair, ArcTask
from data.augment import Augmentation
from data.canvas import EOG, NUM_CLASSES
from data.demo_episodes import DemoEpisodes
from engine.precision import MixedPrecision
from engine.schedule import set_lrs
from evaluation.adaptation import _row_losses, _starts, adapted
from evaluation.evaluate import first_tasks
from evaluation.scoring import grid_logprob
from evaluation.ttt_policy import TTTPolicy
from prompt import with_qwen_features

CPU = torch.device("cpu")


def setup(small_cfg, **flags):
    cfg = small_cfg(**flags)
    training.seed_everything(cfg.run.seed)
    state = training.build_train_state(cfg, CPU)
    eval_set = training.build_data(cfg, CPU).eval_set
    tasks = list({ep.task.task_id: ep.task for ep in eval_set.episodes}.values())
    return cfg, state, eval_set, tasks


def test_an_untrained_adapter_changes_nothing(small_cfg):
    cfg, state, eval_set, tasks = setup(small_cfg)
    demos = DemoEpisodes(tasks, eval_set, seed=0, views=8)
    batch, rows = demos.draw({0: 0, 1: 1}, per_row=3)
    batch = with_qwen_features(batch, state.prompts, 0, training=False)
    adapters = state.model.task_adapters(2)
    with torch.no_grad():
        plain = state.model(batch).logits
        adapted = state.model(batch, "mean", adapters(rows)).logits
    torch.testing.assert_close(adapted, plain, rtol=0, atol=1e-6)


def test_test_time_training_draws_the_same_episodes_whatever_the_search_drew(small_cfg):
    """restart_draws: after any number of the search's draws, training starts the group's stream again."""
    cfg, state, eval_set, tasks = setup(small_cfg)
    demos = DemoEpisodes(tasks, eval_set, seed=0, views=8)
    first, _ = demos.draw({0: 0, 1: 1}, per_row=4)
    for _ in range(3):  # draws before training's
        demos.draw({0: 0, 1: 1}, per_row=4)
    demos.restart_draws()
    again, _ = demos.draw({0: 0, 1: 1}, per_row=4)
    assert torch.equal(first["input"], again["input"]) and torch.equal(first["target"], again["target"])


def test_each_row_of_a_batched_adapter_gets_only_its_own_tasks_gradient(small_cfg):
    """Adapting tasks together is adapting each alone: row r's gradient from the whole batch equals
    its gradient from its own samples only."""
    cfg, state, eval_set, tasks = setup(small_cfg)
    demos = DemoEpisodes(tasks, eval_set, seed=0, views=8)
    batch, rows = demos.draw({0: 0, 1: 1, 2: 2}, per_row=2)
    adapters = state.model.task_adapters(3)
    state.model.requires_grad_(False)

    def grads(keep):
        sub = {k: v[keep] if torch.is_tensor(v) else [v[i] for i in keep.tolist()] for k, v in batch.items()}
        adapters.zero_grad(set_to_none=True)
        amp = MixedPrecision("off", CPU)
        _row_losses(state.model, state.prompts, adapters, sub, rows[keep], 3, cfg, amp).sum().backward()
        return {n: p.grad.clone() for n, p in adapters.named_parameters()}

    everything = grads(torch.arange(len(rows)))
    for row in range(3):
        alone = grads(torch.nonzero(rows == row).flatten())
        for name in everything:
            torch.testing.assert_close(everything[name][row], alone[name][row], rtol=1e-4, atol=1e-6, msg=name)


def search(state, tasks, eval_set, cfg):
    """What the search alone keeps for `tasks` (no test-time training)."""
    with adapted(state.model, state.prompts, tasks, eval_set, cfg=cfg.replace(ttt_steps=0, view_starts=True),
                 device=CPU) as result:
        return result


def test_the_kept_start_is_one_whose_views_size_the_demos_right(small_cfg):
    """Starts whose views give some demo output a wrong shape are never run, and never kept (an
    untried row's demo loss reads 0: a search that forgot them would pick one). Here the demo
    outputs are their inputs scaled down 2x: the kept start forces that view (10) or none."""
    cfg, state, eval_set, _ = setup(small_cfg, ttt_steps=0)
    rng = np.random.default_rng(0)
    grids = [rng.integers(1, 5, (4, 6)) for _ in range(3)]  # no background: the crop keeps 4x6
    task = ArcTask("halved", tuple(ArcPair(g, g[::2, ::2].copy()) for g in grids), ())
    assert sum(views_fitting(task.train)) == 1
    kept = search(state, [task], eval_set, cfg).adapters.gate_bias[0]
    forced = {int(v) for v in torch.nonzero(kept).flatten()}
    assert forced in ({10}, set())


def test_a_view_start_gives_its_view_the_whole_gate_against_a_trained_gate(small_cfg):
    """A trained gate favours the views its training used (+10) and shuns the others (-5); a view
    start must still hand its own view the whole mix, or the agent reads a blend of views (a flip
    start once kept 13-89% of the gate and its flips failed)."""
    cfg, state, _, _ = setup(small_cfg)
    views = state.model.agent.cells.views
    with torch.no_grad():
        views.gate.bias.copy_(torch.linspace(10.0, -5.0, NUM_VIEWS))
    adapters = state.model.task_adapters(1 + NUM_VIEWS)
    _starts(state.model, adapters, [0], 1 + NUM_VIEWS)
    prompt = torch.randn(1, cfg.prompt.prompt_dim)
    for v in range(NUM_VIEWS):
        share = views.weights(prompt, adapters.gate_bias[1 + v][None])[0, v]
        assert share > 0.99, (v, float(share))


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_weight_ttt_trains_under_the_searched_start_and_restores_the_weights(small_cfg, amp):
    """Test-time training after the view-start search: the weights trained under the kept start differ
    from those trained from the plain mean (no search: the start is used), and both are restored bit
    for bit, also under bf16 autocast (float32 weights, bf16 arithmetic)."""
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=2, ttt_lr=1e-2, amp=amp, view_starts=True)
    model = state.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # a task whose search kept a view start (which one does depends on the untrained weights)
    task = next(t for t in tasks if len(t.train) > 1 and search(state, [t], eval_set, cfg).adapters.gate_bias.any())
    trained = []
    for start in (cfg.replace(view_starts=False), cfg):
        with adapted(model, state.prompts, [task], eval_set, cfg=start, device=CPU) as result:
            assert result.steps == {task.task_id: 2}
            trained.append({k: v.clone() for k, v in model.state_dict().items()})
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    changed = [k for k in before if not torch.equal(trained[0][k], trained[1][k])]
    assert changed and all(not torch.equal(trained[1][k], before[k]) for k in changed)


def test_fp16_adaptation_starts_its_scaler_at_the_runs_scale_and_counts_only_applied_steps(small_cfg):
    """--amp fp16: adaptation's GradScaler starts at --fp16_init_scale, as training's does. At 2^100
    every scaled loss overflows fp16, so the scaler skips each of the 4 steps (halving its scale):
    none is counted as taken and nothing moves; at 2^8 all 4 apply."""
    cfg, state, eval_set, tasks = setup(small_cfg, amp="fp16", ttt_steps=4, ttt_lr=1e-2)
    task = next(t for t in tasks if len(t.train) > 1)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    losses = {}
    for scale in (2.0**100, 2.0**8):
        with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg.replace(fp16_init_scale=scale),
                     device=CPU) as result:
            moved = [k for k, v in state.model.state_dict().items() if not torch.equal(v, before[k])]
            losses[scale] = (result.steps[task.task_id], result.demo_loss[task.task_id], moved)
    assert losses[2.0**100][0] == 0 and losses[2.0**8][0] == 4
    assert not losses[2.0**100][2] and losses[2.0**8][2]  # the shared weights moved under 2^8 only (restored)
    assert losses[2.0**100][1] != losses[2.0**8][1]


def test_a_task_whose_demos_come_out_exact_takes_every_step(small_cfg):
    """No early stop (evaluation/ttt_policy.py): with an agent that copies its input, copy tasks, their
    demos exact before the first step, take every step alone and together, as a task of another rule
    beside them does."""
    from tests.test_evaluation import CopyAgent
    cfg, state, eval_set, _ = setup(small_cfg, ttt_steps=6)
    state.model.agent = CopyAgent()
    rng = np.random.default_rng(0)
    copy = [ArcTask(f"copy{i}", tuple(ArcPair(g, g.copy()) for g in rng.integers(0, 5, (3, 4, 4))), ())
            for i in range(2)]
    flip = ArcTask("flip", tuple(ArcPair(g, g[::-1].copy()) for g in rng.integers(0, 5, (3, 4, 4))), ())
    for group in ([copy[0]], [flip], [*copy, flip], copy):
        with adapted(state.model, state.prompts, group, eval_set, cfg=cfg, device=CPU) as result:
            assert result.steps == {t.task_id: 6 for t in group}


def test_test_time_training_descends_the_loss_of_loss_function(small_cfg, monkeypatch):
    """The loss adaptation trains on is loss_function's: a change to a loss coefficient (--hard_weight)
    changes the demo loss test-time training reaches and the weights it ends with; and the demo loss
    it reports is loss_function.adaptation_loss of the adapted model on every demo."""
    import loss_function
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=3, ttt_lr=1e-2)
    task = next(t for t in tasks if len(t.train) > 1)
    seen = []
    real = loss_function.adaptation_loss
    monkeypatch.setattr("evaluation.adaptation.adaptation_loss", lambda *a, **k: seen.append(k["cfg"]) or real(*a, **k))
    ends = []
    for hard_weight in (2.0, 8.0):
        with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg.replace(hard_weight=hard_weight),
                     device=CPU) as result:
            moved = [p.detach().clone() for p in state.model.ttt_parameters()]
            ends.append((result.demo_loss[task.task_id], moved))
    assert {c.hard_weight for c in seen} == {2.0, 8.0}
    assert ends[0][0] != ends[1][0]
    assert any(not torch.equal(a, b) for a, b in zip(ends[0][1], ends[1][1], strict=True))


def test_weight_ttt_shows_the_adapting_weights_to_an_observer_before_and_after_every_step(small_cfg):
    """`observe(steps, adapted)` sees 0 (the weights as trained) and then each step's weights: each
    call's weights differ from the last; after the context the weights are the trained ones again."""
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=3, ttt_lr=1e-2)
    task = next(t for t in tasks if len(t.train) > 1)
    weight = state.model.agent.head.out.weight
    trained, seen = weight.detach().clone(), []
    with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg, device=CPU,
                 observe=lambda steps, adaptation: seen.append((steps, weight.detach().clone()))):
        pass
    assert [s for s, _ in seen] == [0, 1, 2, 3]
    assert torch.equal(seen[0][1], trained) and torch.equal(weight, trained)
    assert all(not torch.equal(a, b) for (_, a), (_, b) in zip(seen, seen[1:], strict=False))


def test_ttt_curve_scores_every_demo_episode_and_test_pair_at_every_mark(small_cfg):
    """bench/ttt_curve.py on a short run: at each mark, one score per leave-one-out demo episode and per
    test pair of the first `tasks` evaluation tasks with more than one demo, each in [0, 1]."""
    from bench.ttt_curve import COLUMNS, curve
    cfg = small_cfg(epochs=1, max_batches=2)
    training.train(cfg, CPU)
    eval_set = training.build_data(cfg, CPU).eval_set
    first = first_tasks(eval_set, 2)
    every = {ep.task.task_id: ep.task for ep in eval_set.episodes}
    assert len(every) > len(first)
    tasks = [every[t] for t in first if len(every[t].train) > 1]
    assert tasks
    table = curve(cfg.run.run_dir, tasks=len(first), marks=[0, 2], settings={"ttt_lr": 1e-2})
    assert sorted(table) == [0, 2]
    for cols in table.values():
        assert sorted(cols) == sorted(f"{w}_{c}" for w in ("demo", "test") for c in COLUMNS)
        assert all(len(cols[f"demo_{c}"]) == sum(len(t.train) for t in tasks) for c in COLUMNS)
        assert all(len(cols[f"test_{c}"]) == sum(len(t.test) for t in tasks) for c in COLUMNS)
        assert all(((v >= 0) & (v <= 1)).all() for v in cols.values())


def test_the_per_family_exact_match_counts_the_scored_tasks_only(small_cfg):
    """bench.learnability's per-family exact match (evaluate_variant) reads the submission of the first
    --eval_tasks tasks; the evaluation set holds every evaluation task (a task not scored is not a miss)."""
    from bench.learnability import evaluate_variant
    cfg = small_cfg(data="synthetic:40", synthetic_rules="recolour", synthetic_eval_rules="flip,transpose",
                    epochs=1, max_batches=2, eval_tasks=3, ttt_steps=0)
    training.train(cfg, CPU)
    eval_set = training.build_data(cfg, CPU).eval_set
    scored = first_tasks(eval_set, 3)
    assert len({ep.task.task_id for ep in eval_set.episodes}) > len(scored)
    by_family: dict = {}
    metrics = evaluate_variant(cfg, Path(cfg.run.run_dir), by_family)
    assert metrics["eval/tasks"] == 3
    assert set(by_family) == {t.rsplit("-", 1)[-1] for t in scored}
    assert all(0 <= v <= 1 for v in by_family.values())


def test_grid_logprob_hand_worked():
    """A 1x1 grid [[3]] on a 2x2 canvas: the colour at (0, 0) and end-of-grid markers at (0, 1),
    (1, 0) and (1, 1). With log p = -1 for those four classes there and -5 elsewhere, the grid scores
    -4; a 2x1 grid does not fit a view of side 1."""
    logp = np.full((2, 2, NUM_CLASSES), -5.0)
    logp[0, 0, 3] = logp[0, 1, EOG] = logp[1, 0, EOG] = logp[1, 1, EOG] = -1.0
    assert grid_logprob(np.array([[3]]), Augmentation(), logp) == -4.0
    assert grid_logprob(np.array([[3], [3]]), Augmentation(), logp[:1, :1]) == float("-inf")


def test_training_on_evaluation_demos_never_reads_their_test_outputs(arc_folder, small_cfg, tmp_path, capsys):
    """--train_on_eval_demos --task_embedding: every evaluation test output changed, the trained
    weights are bit-identical; the evaluation tasks' demos did join training."""
    import json
    import shutil

    from safetensors.torch import load_file

    changed = tmp_path / "changed"
    shutil.copytree(arc_folder, changed)
    for f in (changed / "evaluation").glob("*.json"):
        task = json.loads(f.read_text())
        for pair in task["test"]:
            pair["output"] = [[(c + 1) % 10 for c in row] for row in pair["output"]]
        f.write_text(json.dumps(task))
    weights = []
    for data in (arc_folder, changed):
        cfg = small_cfg(data=str(data), run_dir=str(tmp_path / data.name), train_on_eval_demos=True,
                        task_embedding=True, max_batches=3, eval_tasks=1)
        summary = training.train(cfg, CPU)
        assert summary["transductive"] is True
        ckpt = tmp_path / data.name / "checkpoints" / "step_00000003" / "model.safetensors"
        weights.append(load_file(str(ckpt)))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    data = training.build_data(cfg, CPU)
    eval_ids = {t.task_id for t in data.splits.evaluation}
    assert eval_ids <= set(data.task_ids)
    assert weights[0]["task_embedding.weight"].shape[0] == len(data.task_ids)
    # the run says so: in its start-up line and in TensorBoard
    assert "TRANSDUCTIVE: the demos of 3 evaluation tasks join training" in capsys.readouterr().err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / arc_folder.name), size_guidance={"tensors": 0})
    events.Reload()
    assert events.Tensors("transductive/text_summary")[0].tensor_proto.string_val[0] == b"True"


def test_cosine_schedule_takes_every_group_from_its_lr_towards_zero():
    """--ttt_schedule cosine: step 0 at each group's own lr, half of it halfway, the last step small
    but not zero, the groups' ratio kept (each group its own base lr); constant
    leaves every step at the lr."""
    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.Adam([{"params": weights[:1], "lr": 1e-2}, {"params": weights[1:], "lr": 0.1}])
    base = [1e-2, 0.1]
    seen = []
    for step in range(10):
        set_lrs(optimizer, base, TTTPolicy(10, "cosine").lr_factor(step))
        seen.append([g["lr"] for g in optimizer.param_groups])
    seen = np.array(seen)
    np.testing.assert_allclose(seen[0], base)
    np.testing.assert_allclose(seen[5], np.array(base) / 2)
    assert (np.diff(seen, axis=0) < 0).all() and (0 < seen[-1]).all() and (seen[-1] < 0.03 * np.array(base)).all()
    np.testing.assert_allclose(seen[:, 1] / seen[:, 0], 10.0)
    set_lrs(optimizer, base, TTTPolicy(10, "constant").lr_factor(7))
    assert [g["lr"] for g in optimizer.param_groups] == base


def test_warmup_rises_linearly_then_the_schedule_runs_over_the_steps_after_it():
    """--ttt_warmup 0.2 of 10 steps: steps 0 and 1 at a half and all of the lr, then the cosine from
    the full lr (step 2) to near 0 over the remaining 8 steps."""
    from engine.schedule import warmed_factor
    factors = [warmed_factor("cosine", step, 10, 0.2) for step in range(10)]
    np.testing.assert_allclose(factors[:3], [0.5, 1.0, 1.0])
    assert (np.diff(factors[2:]) < 0).all() and 0 < factors[-1] < 0.05
    assert [warmed_factor("constant", step, 10, 0.2) for step in range(10)] == [0.5] + [1.0] * 9
    from engine.schedule import lr_factor
    assert [warmed_factor("cosine", step, 10, 0.0) for step in range(10)] == \
        [lr_factor("cosine", step / 10) for step in range(10)], "no warm-up: the schedule as before"


def test_warmup_changes_what_test_time_training_ends_with(small_cfg):
    """--ttt_warmup reaches the loop: the same steps end with other weights, restored after."""
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=4, ttt_lr=1e-2)
    task = next(t for t in tasks if len(t.train) > 1)
    weight = state.model.agent.head.out.weight
    trained, ends = weight.detach().clone(), []
    for warmup in (0.0, 0.5):
        with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg.replace(ttt_warmup=warmup), device=CPU):
            ends.append(weight.detach().clone())
    assert not torch.equal(ends[0], ends[1]) and torch.equal(weight, trained)


def test_view_rows_give_each_view_its_own_latent_trained_with_the_weights(small_cfg):
    """--ttt_view_rows: the task's adapter holds a row per training view, all starting as the kept
    start; test-time training moves every view's latent apart (each view an auxiliary task) along
    with the weights; a sample reads its augmentation's row (a view without one: the identity's);
    the shared weights end as they started."""
    from data.augment import view_ids
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=4, ttt_lr=1e-2, ttt_views=4,
                                        ttt_batch_size=8,
                                        ttt_view_rows=True)
    task = next(t for t in tasks if len(t.train) > 1)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg, device=CPU) as result:
        rows = result.adapters
        assert rows.view_ids == tuple(view_ids(4)) and rows.latent.shape[0] == 4
        latents = rows.latent.detach()
        assert all(not torch.equal(latents[i], latents[j]) for i in range(4) for j in range(i))
        batch = {"task_id": [task.task_id] * 3,
                 "augmentation": [Augmentation.from_id(a, 1) for a in (view_ids(4)[2], 0, view_ids(9)[-1])]}
        read = result.rows_of(batch, CPU).latent
        torch.testing.assert_close(read, latents[[2, 0, 0]])
    assert all(torch.equal(v, state.model.state_dict()[k]) for k, v in before.items())


def test_ttt_dropout_drops_block_changes_in_training_steps_only_seeded_by_the_task(small_cfg):
    """--ttt_dropout: the same steps end with other weights than without it, twice the same (its masks
    seeded by the task, not by what ran before: the global stream is drawn from in between), the
    global stream left as it was, and no hook left on the model (its output as before)."""
    cfg, state, eval_set, tasks = setup(small_cfg, ttt_steps=3, ttt_lr=1e-2)
    task = next(t for t in tasks if len(t.train) > 1)
    weight = state.model.agent.head.out.weight
    ends = []
    for dropout in (0.0, 0.3, 0.3):
        torch.rand(5)  # the global stream moves between tasks
        before = torch.random.get_rng_state()
        with adapted(state.model, state.prompts, [task], eval_set, cfg=cfg.replace(ttt_dropout=dropout), device=CPU):
            ends.append(weight.detach().clone())
        assert torch.equal(torch.random.get_rng_state(), before)
    assert not torch.equal(ends[0], ends[1]) and torch.equal(ends[1], ends[2])
    assert all(not block._forward_hooks for block in state.model.agent.residual_blocks())
