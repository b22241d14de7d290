"""--lr_schedule: every training lr follows the run's progress, by steps or by the --max_minutes clock."""

import math

import pytest
import torch

import training
from engine.schedule import TRAIN_LR_FLOOR, TrainingSchedule, lr_factor, run_progress

CPU = torch.device("cpu")


def test_progress_is_the_further_of_steps_and_clock():
    assert run_progress(5, 10) == 0.5
    assert run_progress(5, 10, seconds=90, budget_seconds=100) == 0.9  # the clock runs out first
    assert run_progress(5, 10_000, seconds=30, budget_seconds=60) == 0.5  # --epochs 1000 --max_minutes 1
    assert run_progress(20, 10) == 1.0 and run_progress(3, 0) == 0.0


def test_cosine_goes_from_the_base_to_a_tenth():
    assert lr_factor("cosine", 0.0, TRAIN_LR_FLOOR) == 1.0
    assert lr_factor("cosine", 0.5, TRAIN_LR_FLOOR) == pytest.approx(0.55)
    assert lr_factor("cosine", 1.0, TRAIN_LR_FLOOR) == pytest.approx(0.1)
    assert lr_factor("constant", 0.7, TRAIN_LR_FLOOR) == 1.0
    with pytest.raises(ValueError, match="linear.*constant, cosine"):
        lr_factor("linear", 0.5)


def test_every_optimizer_group_decays_from_its_own_base_even_after_a_resume_loads_decayed_lrs(small_cfg):
    cfg = small_cfg(task_embedding=True, lr_schedule="cosine")
    state = training.build_train_state(cfg, CPU, tasks=3)
    optimizers = [state.optimizer, state.rl_optimizer]
    schedule = TrainingSchedule("cosine", optimizers, total_steps=10)
    schedule.apply(10, 0.0)
    lrs = {g["name"]: g["lr"] for g in state.optimizer.param_groups}
    assert lrs == pytest.approx({"main": 0.1 * cfg.optim.agent_lr, "task_embedding": 0.1 * cfg.optim.task_embedding_lr})
    assert state.rl_optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * cfg.optim.rl_lr)
    saved = [o.state_dict() for o in optimizers]  # what a checkpoint holds: the decayed lrs
    fresh = training.build_train_state(cfg, CPU, tasks=3)
    resumed = TrainingSchedule("cosine", [fresh.optimizer, fresh.rl_optimizer], total_steps=10)
    for o, s in zip([fresh.optimizer, fresh.rl_optimizer], saved, strict=True):
        o.load_state_dict(s)
    resumed.apply(5, 0.0)
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optim.agent_lr * 0.55)


@pytest.mark.slow
def test_a_cosine_run_logs_its_factor_and_trains_other_weights_than_a_constant_one(small_cfg, tmp_path):
    from tests.test_end_to_end import scalars
    runs = {s: training.train(small_cfg(run_dir=str(tmp_path / s), max_batches=4, lr_schedule=s), CPU)
            for s in ("constant", "cosine")}
    factors = [v for _, v in scalars(runs["cosine"]["run_dir"])["optim/lr_factor"]]
    assert factors == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)])
    assert [v for _, v in scalars(runs["constant"]["run_dir"])["optim/lr_factor"]] == [1.0] * 4
    assert runs["constant"]["loss/combined"] != runs["cosine"]["loss/combined"]


def test_a_warm_up_rises_linearly_then_the_schedule_runs_over_the_rest(small_cfg):
    """--lr_warmup 0.2 over 10 steps: factors 0.01 (step 0: never 0), 0.5 (step 1 = progress 0.1 of 0.2),
    then the cosine over progress 0.2..1: 1 at step 2, 0.55 at step 6 (halfway), 0.1 at step 10."""
    cfg = small_cfg()
    state = training.build_train_state(cfg, CPU, tasks=1)
    schedule = TrainingSchedule("cosine", [state.optimizer], total_steps=10, warmup=0.2)
    factors = [schedule.apply(step, 0.0) for step in (0, 1, 2, 6, 10)]
    assert factors == pytest.approx([0.01, 0.5, 1.0, 0.55, 0.1])
    assert state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * cfg.optim.agent_lr)
    assert TrainingSchedule("constant", [state.optimizer], total_steps=10, warmup=0.5).apply(9, 0.0) == 1.0
