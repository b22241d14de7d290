"""Tasks adapted together (evaluation/task_batch.py): K tasks' shared-weight test-time training in
one vmapped step gives each task what adapting it alone gives, the model's weights end as they
started, and a validation with tasks adapted together scores as one task at a time."""

import numpy as np
import pytest
import torch

from data.arc import ArcPair, ArcTask
from data.demo_episodes import DemoEpisodes, pool_side
from data.episodes import EpisodeDataset, evaluation_episodes
from evaluation.adaptation import adapted
from evaluation.evaluate import candidates, score_tasks, task_groups
from evaluation.task_batch import batches_shared_weights
from tests.test_adaptation import setup as adaptation_setup

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default
pytestmark = pytest.mark.numeric

CPU = torch.device("cpu")


def setup(small_cfg, **flags):
    return adaptation_setup(small_cfg, **flags)[:3]


def made_tasks(rules: dict[str, callable], side: int = 4, demos: int = 3) -> list[ArcTask]:
    """Tasks of `demos` demos and one test pair, every grid side x side (so every pool has one side)."""
    rng = np.random.default_rng(1)
    tasks = []
    for name, rule in rules.items():
        grids = [rng.integers(0, 4, (side, side)) for _ in range(demos + 1)]
        pairs = tuple(ArcPair(g, rule(g)) for g in grids)
        tasks.append(ArcTask(name, pairs[:demos], pairs[demos:]))
    return tasks


RULES = {"flip": np.fliplr, "recolour": lambda g: np.where(g == 1, 2, g), "turn": np.rot90,
         "copy": lambda g: g.copy()}


def adapt_alone_and_together(cfg, state, eval_set, tasks, observe=None):
    """Each task's (steps, demo loss, candidates' mean log-probabilities) adapted alone and together
    (`observe` given to each adaptation)."""
    model, prompts = state.model, state.prompts
    episodes = {t.task_id: i for i, t in enumerate(tasks)}  # one test pair a task
    test_set = EpisodeDataset(evaluation_episodes(tuple(tasks)), eval_set.scale, fit_target=False)

    def outcome(result, task):
        result.load(task.task_id)
        cands = candidates(model, prompts, test_set, [episodes[task.task_id]], cfg=cfg, device=CPU, adapted=result)
        logps = np.stack([logp for _, logp in cands[episodes[task.task_id]].views])  # every view's [S, S, 12]
        return result.steps[task.task_id], result.demo_loss[task.task_id], logps

    alone = {}
    for task in tasks:
        with adapted(model, prompts, [task], test_set, cfg=cfg, device=CPU, observe=observe) as result:
            alone[task.task_id] = outcome(result, task)
    with adapted(model, prompts, tasks, test_set, cfg=cfg, device=CPU, observe=observe) as result:
        assert result.weights is not None
        together = {t.task_id: outcome(result, t) for t in tasks}
    return alone, together


# Tasks adapted together in float32 against each alone: a vmapped convolution, matrix product or attention sums
# in another order than one task's, and six Adam steps (each element's step is its gradient over that gradient's
# own size, so a gradient near zero turns its rounding into a whole step) carry that into the predictions.
# Measured on 2 cores (tests/test_task_batch.py, every float32 case under ATEN_CPU_CAPABILITY default, avx2
# and avx512, 2026-11-29): a view's log-probability moved by at most 1.1e-4 nats (1.2e-4 relative on another
# AVX2 machine), and a demo loss by under 1e-5 relative. A task that read another task's copy would move them
# by what adaptation moves them: 1.7-3.5 nats a log-probability on average, up to 10 (measured the same way).
# So the float32 tolerance is 1e-2 nats absolute and 1e-3 relative on the loss: a hundred times under what a
# wrong copy moves, ten times over what the summation order does on any kernel set torch picks.
FLOAT32 = dict(loss_rel=1e-3, loss_abs=1e-5, logp_rtol=0.0, logp_atol=1e-2)


def float32_approx(loss: float):
    """A demo loss of a task adapted alone, as one adapted together may end it in float32 (FLOAT32)."""
    return pytest.approx(loss, rel=FLOAT32["loss_rel"], abs=FLOAT32["loss_abs"])


def together_as_alone(small_cfg, tolerance: dict, **flags) -> dict:
    """The RULES tasks adapted for 6 steps alone and together under `flags`:
    equal steps, demo losses and view predictions to `tolerance` (loss_rel, loss_abs, logp_rtol,
    logp_atol), the model's weights bit for bit as they started. -> the alone outcomes."""
    cfg, state, eval_set = setup(small_cfg, ttt_steps=6, ttt_lr=3e-3, **flags)
    assert batches_shared_weights(cfg)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    alone, together = adapt_alone_and_together(cfg, state, eval_set, made_tasks(RULES))
    for task_id, (steps, loss, logps) in alone.items():
        got_steps, got_loss, got_logps = together[task_id]
        assert got_steps == steps == 6
        assert got_loss == pytest.approx(loss, rel=tolerance["loss_rel"], abs=tolerance["loss_abs"])
        np.testing.assert_allclose(got_logps, logps, rtol=tolerance["logp_rtol"], atol=tolerance["logp_atol"])
    assert all(torch.equal(v, state.model.state_dict()[k]) for k, v in before.items())
    return alone


@pytest.mark.parametrize("flags", [
    dict(),  # the default: all weights with the clip
    dict(view_starts=True, ttt_schedule="cosine", ttt_warmup=0.2, clip=0.05),
    # VARC's recipe: a latent row per view trained with the weights, dropout of each block's change
    dict(ttt_view_rows=True, ttt_dropout=0.3, ttt_schedule="cosine", ttt_warmup=0.2),
    dict(ttt_view_rows=True, ttt_dropout=0.3, agent="rope", agent_channels=16, agent_cycles=2),  # blocks twice a pass
    dict(agent="rope", agent_channels=16, view_starts=True),  # scaled_dot_product_attention under vmap
])
def test_tasks_adapted_together_end_as_each_alone(small_cfg, flags):
    """Steps, demo losses after adaptation and every view's prediction equal adapting each task alone
    (float tolerance: a vmapped convolution sums in another order), from the mean (the default) and
    under the search's kept starts with a schedule, warm-up and a clip tight enough to bind every step
    (the rope agent's starts too: scaled_dot_product_attention under vmap); the
    model's weights end bit for bit as they started."""
    alone = together_as_alone(small_cfg, FLOAT32, **flags)
    moved = [alone[t][1] for t in alone]
    assert len(set(np.round(moved, 4))) == len(moved)  # the tasks went separate ways


@pytest.mark.parametrize("agent", ["conv", "rope"])
def test_tasks_adapted_together_under_bf16_end_as_each_alone_to_its_precision(small_cfg, agent):
    """--amp bf16 (the GPU recipes'; engine/precision.Float32LayerNorm lets vmap run it): steps, demo
    losses and every view's prediction equal adapting each task alone to bf16's rounding. A vmapped
    step rounds its bf16 intermediates after sums in another order, as switching bf16 on moves them:
    measured at 6 steps, up to 1.6% of a demo loss and 0.15 nats of a view's log-probability, about
    what bf16 against float32 moves them alone (that each task reads only its own copy is held to
    float tolerance in float32 above); the model's weights end bit for bit as they started."""
    together_as_alone(small_cfg, dict(loss_rel=5e-2, loss_abs=0.0, logp_rtol=0.0, logp_atol=0.3), agent=agent,
                      amp="bf16")


def test_groups_of_tasks_adapted_together_never_mix_canvas_sides(small_cfg):
    cfg, _, eval_set = setup(small_cfg)
    tasks = made_tasks(RULES, side=4) + made_tasks({"big": RULES["flip"]}, side=7)
    sides = {t.task_id: pool_side(t, eval_set) for t in tasks}
    assert sides["big"] == 8 and {sides[t] for t in RULES} == {5}
    assert DemoEpisodes(tasks[:1], eval_set, 0, 8).sides == [sides["flip"]]
    groups = task_groups(list(sides), sides.__getitem__, 3, one_side=True)
    assert groups == [["copy", "flip", "recolour"], ["turn"], ["big"]]
    assert task_groups(list(sides), sides.__getitem__, 3, one_side=False) == [["copy", "flip", "recolour"],
                                                                               ["turn", "big"]]


def test_a_validation_adapting_tasks_together_scores_as_one_at_a_time(small_cfg):
    """score_tasks with --adapt_tasks 4 (shared weights: grouped by side, adapted together) gives the
    attempts and TTT steps of --adapt_tasks 1."""
    cfg, state, eval_set = setup(small_cfg, ttt_steps=3, eval_augments=2)
    task_ids = list(dict.fromkeys(ep.task.task_id for ep in eval_set.episodes))[:6]
    scores = {}
    for k in (1, 4):
        run = cfg.replace(adapt_tasks=k)
        scores[k] = score_tasks(state.model, state.prompts, eval_set, task_ids, cfg=run, device=CPU)
    assert scores[1].ttt_steps == scores[4].ttt_steps
    same = [all(np.array_equal(a, b) for a, b in zip(scores[1].attempts[i], scores[4].attempts[i], strict=True))
            for i in scores[1].attempts]
    assert sum(same) == len(same)


def test_what_ties_the_tasks_of_a_step_adapts_one_task_at_a_time(small_cfg):
    cfg, _, _ = setup(small_cfg)
    assert batches_shared_weights(cfg)
    for flags in (dict(amp="bf16"), dict(ttt_dropout=0.1), dict(ttt_view_rows=True)):
        assert batches_shared_weights(cfg.replace(**flags))
    assert not batches_shared_weights(cfg.replace(amp="fp16"))



def test_a_task_whose_gradient_is_not_finite_keeps_its_weights_and_the_others_go_on(small_cfg, monkeypatch):
    """A loss that is NaN for one task's episodes (its inputs are background only, under every view;
    the others' never are): that task takes no step and ends with the weights it started from,
    alone and together; the others train as they would alone."""
    import evaluation.adaptation
    import evaluation.task_batch

    real = evaluation.task_batch.adaptation_loss

    def poisoned(logits, refined, prompt, target, input_canvas, *, cfg):
        coloured = ((input_canvas > 0) & (input_canvas < 10)).any()
        nan_if_blank = torch.where(coloured, torch.tensor(1.0), torch.tensor(float("nan")))  # NaN gradients too
        return real(logits, refined, prompt, target, input_canvas, cfg=cfg) * nan_if_blank
    for module in (evaluation.task_batch, evaluation.adaptation):
        monkeypatch.setattr(module, "adaptation_loss", poisoned)
    cfg, state, eval_set = setup(small_cfg, ttt_steps=4, ttt_lr=3e-3)
    tasks = made_tasks({"flip": RULES["flip"], "copy": RULES["copy"]})
    blank = ArcTask("blank", tuple(ArcPair(np.zeros((4, 4), dtype=np.int64), np.full((4, 4), 3)) for _ in range(3)),
                    tasks[0].test)
    alone, together = adapt_alone_and_together(cfg, state, eval_set, [*tasks, blank])
    assert alone["blank"][0] == together["blank"][0] == 0
    np.testing.assert_allclose(together["blank"][2], alone["blank"][2], rtol=1e-5, atol=1e-6)  # its start's weights
    assert alone["flip"][0] == together["flip"][0] == 4
    for task_id in ("flip", "copy"):
        assert together[task_id][1] == float32_approx(alone[task_id][1])


def test_a_gradient_turning_non_finite_ends_the_task_there_alone_and_together(small_cfg, monkeypatch):
    """The one policy of evaluation/ttt_policy.py in both loops: the third step's loss is NaN (the
    fourth's would not be); alone and together each task ends after two steps with the weights two
    steps give (what --ttt_steps 2 predicts), where skipping the step and going on would take a third."""
    import evaluation.adaptation
    import evaluation.task_batch

    real = evaluation.task_batch.adaptation_loss
    armed = []

    def poisoned(*args, cfg):
        return real(*args, cfg=cfg) * (float("nan") if armed else 1.0)

    def third_step_nan(steps, result):
        if steps == 2:
            armed.append(True)
        else:
            armed.clear()
    for module in (evaluation.task_batch, evaluation.adaptation):
        monkeypatch.setattr(module, "adaptation_loss", poisoned)
    flags = dict(ttt_lr=3e-3, ttt_schedule="constant", ttt_warmup=0.0)
    cfg, state, eval_set = setup(small_cfg, ttt_steps=4, **flags)
    tasks = made_tasks({"flip": RULES["flip"], "copy": RULES["copy"]})
    alone, together = adapt_alone_and_together(cfg, state, eval_set, tasks, observe=third_step_nan)
    two, _ = adapt_alone_and_together(cfg.replace(ttt_steps=2), state, eval_set, tasks)
    for task_id, (steps, _, logps) in two.items():
        assert steps == alone[task_id][0] == together[task_id][0] == 2
        np.testing.assert_allclose(alone[task_id][2], logps, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(together[task_id][2], logps, rtol=0.0, atol=FLOAT32["logp_atol"])
