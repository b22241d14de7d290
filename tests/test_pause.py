"""A stop is a pause: a time-bounded run stopped and resumed trains its --max_minutes once, on one lr
curve, and validates once; a run killed in its final validation continues it from its journal."""

import json
import os
import signal
import time

import pytest

import training
from engine.run_logger import read_scalars
from tests.conftest import CPU
from tests.test_loop_faults import cli, small_args, wait_for_checkpoint

BUDGET_MINUTES = 0.15


@pytest.mark.slow
def test_a_time_bounded_run_stopped_and_resumed_trains_its_budget_once_on_one_lr_curve(arc_folder, tmp_path,
                                                                                     warm_python):
    """SIGTERM at about 40% of the budget, then the same command with --resume: the training seconds
    over both invocations end within a step of the budget, the cosine's lr factor goes on falling from
    where it stopped (it would restart at 1 with a budget of the resumed run's own), one final validation."""
    run_dir = tmp_path / "run"
    args = small_args(arc_folder, run_dir, "--epochs", "1000", "--max_minutes", str(BUDGET_MINUTES),
                      "--lr_schedule", "cosine", "--val_every", "end", "--ttt_steps", "0", "--log_every", "1",
                      "--save_every", "1")
    proc = cli(*args)
    wait_for_checkpoint(run_dir, proc)  # training has begun
    time.sleep(0.4 * 60 * BUDGET_MINUTES)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-1500:]
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
    assert training.main([*args, "--resume", str(run_dir)]) == 0  # in this process: no signal reaches it
    scalars = read_scalars(run_dir)
    factors = [v for _, v in sorted(scalars["optim/lr_factor"])]
    steps = [s for s, _ in sorted(scalars["optim/lr_factor"])]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > stopped_at > 1
    # one falling curve: no step's factor above the one before (a new budget would restart at 1.0)
    assert all(b <= a + 1e-6 for a, b in zip(factors, factors[1:], strict=False)), factors
    assert factors[-1] < 0.2  # the cosine reached its floor region (0.1) as the whole budget ended
    (minutes_step, trained_minutes), = scalars["heldout/train_minutes"]  # one final validation
    assert len(scalars["eval/pass2"]) == 1 and minutes_step == steps[-1]
    per_step = 60 * trained_minutes / steps[-1]
    assert 60 * BUDGET_MINUTES <= 60 * trained_minutes <= 60 * BUDGET_MINUTES + 2 * per_step + 0.5


def test_a_resumed_run_whose_budget_is_spent_trains_nothing_and_validates_at_its_step(small_cfg, tmp_path):
    """--max_minutes counts over every invocation: resumed after it ran out, the run takes no step."""
    run = tmp_path / "run"
    cfg = small_cfg(run_dir=str(run), epochs=1000, max_batches=2, max_minutes=0.02, val_every="end", eval_tasks=1,
                    ttt_steps=1)
    first = training.train(cfg, CPU)
    assert first["train_seconds"] >= 1.2 and first["eval/tasks"] == 1  # 0.02 min
    second = training.train(cfg.replace(resume=str(run)), CPU)
    assert second["steps"] == first["steps"] and second["train_seconds"] == 0.0 and second["eval/tasks"] == 1
    longer = training.train(cfg.replace(resume=str(run), max_minutes=0.04), CPU)  # a larger budget: the rest of it
    assert longer["steps"] > first["steps"]
    per_step = longer["train_seconds"] / (longer["steps"] - first["steps"])
    # what was left of the 2.4 s and the step running as it ran out, not a new 2.4 s (steps slow on a loaded machine)
    assert 0 < longer["train_seconds"] < 2.4 - first["train_seconds"] + per_step + 0.5


@pytest.mark.slow
def test_a_run_killed_in_its_final_validation_continues_it_from_the_journal(arc_folder, tmp_path, capsys,
                                                                            warm_python):
    """A time-bounded run SIGKILLed once its final validation's journal holds a task, then the same
    command with --resume: no training step (its budget is spent), the journaled tasks not scored
    again nor the held-out loss measured again, the submission byte for byte an uninterrupted
    validation's of the same checkpoint."""
    run_dir = tmp_path / "killed"
    args = small_args(arc_folder, run_dir, "--epochs", "1000", "--max_minutes", "0.05", "--eval_tasks", "0",
                      "--ttt_steps", "30", "--submission", str(run_dir / "submission.json"))
    proc = cli(*args)
    deadline = time.time() + 240
    while not (journals := list((run_dir / "journal").glob("final-step_*.jsonl"))) or \
            journals[0].read_text().count('"task"') < 1:
        assert proc.poll() is None and time.time() < deadline, "the validation ended before a task was journaled"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    journal, = journals
    step = int(journal.name.split("_")[1].split(".")[0])
    done = [json.loads(line)["task"] for line in journal.read_text().splitlines()[1:] if '"task"' in line]
    assert 1 <= len(done) < 3, "killed in the middle of the validation"
    capsys.readouterr()  # the continuation and the check in this process: no signal reaches them
    assert training.main([*args, "--resume", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"done: {step} steps") and "no training left" in err
    assert "held-out loss: as measured before the stop" in err  # measured once, before the kill
    assert journal.read_text().count('"heldout"') == 1
    scored = [json.loads(line)["task"] for line in journal.read_text().splitlines()[1:] if '"task"' in line]
    assert scored[:len(done)] == done and len(scored) == len(set(scored)) == 3  # none scored twice
    alone = tmp_path / "alone"
    assert training.main(small_args(arc_folder, alone, "--eval_only", "--resume",
                                    str(run_dir / "checkpoints" / f"step_{step:08d}"), "--eval_tasks", "0",
                                    "--ttt_steps", "30", "--submission", str(alone / "submission.json"))) == 0
    assert (run_dir / "submission.json").read_bytes() == (alone / "submission.json").read_bytes()
