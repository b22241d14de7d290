"""The loop under every precision and fault: no scaler assertion anywhere, NaN storms stop with a
checkpoint, signals checkpoint and exit, a killed run resumes to the same weights."""

import os
import signal
import socket
import time

import pytest
import torch
from safetensors.torch import load_file

import training
from engine.checkpoint import STATE_FILE, find_checkpoint, load_state, write_checksums
from engine.precision import MixedPrecision
from tests.conftest import ROOT, WARM_PYTHON, run_command, start_command
from training.step import train_step


@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
@pytest.mark.parametrize("qwen_train", ["frozen", "full"])
def test_no_scaler_assertion_in_any_combination(amp, qwen_train, small_cfg, tmp_path):
    """docs/invariants.md #1: amp x frozen/trainable Qwen with caching x grad_accum 2 over 3 batches (a
    partial last window, and --max_batches ending mid-window)."""
    cfg = small_cfg(amp=amp, qwen_train=qwen_train, grad_accum=2, max_batches=3, prompt_refresh=2,
                    run_dir=str(tmp_path / "run"), fp16_init_scale=256.0)
    summary = training.train(cfg, torch.device("cpu"))
    assert summary["steps"] == 2


def test_bf16_has_no_scaler():
    amp = MixedPrecision("bf16", torch.device("cpu"))
    assert amp.scaler is None and amp.scale == 1.0


def cli(*args):
    """fixed.py with `args` in a process of its own (a warm one in a test that asks for warm_python)."""
    return start_command([*WARM_PYTHON, "fixed.py", *args])


def small_args(arc_folder, run_dir, *extra):
    """small_cfg's flags for fixed.py (validation: one task, 4 test-time-training steps)."""
    return ["--data", str(arc_folder), "--batch_size", "4", "--agent_channels", "16", "--prompt_dim", "32",
            "--eval_tasks", "1", "--ttt_steps", "4", "--ttt_small_steps", "0", "--run_dir", str(run_dir), *extra]


def test_nan_storm_stops_with_a_message_and_a_checkpoint(arc_folder, tmp_path, warm_python):
    # A learning rate of 1e30 turns the weights to inf after the first step; every later loss is NaN.
    proc = cli(*small_args(arc_folder, tmp_path / "run", "--agent_lr", "1e30", "--max_consecutive_skips", "3",
                           "--max_batches", "8"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-1500:]
    assert "3 steps in a row skipped" in err and "Traceback" not in err
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
    assert not (tmp_path / "run" / "summary.json").exists(), "a stopped run must not look finished"


def wait_for_checkpoint(run_dir, proc, timeout=120):
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + timeout
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()[1][-1500:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_signal_saves_at_the_window_boundary_and_exits_cleanly(arc_folder, tmp_path, capsys, warm_python):
    """SIGTERM (a scheduler's preemption) in training; SIGINT, the same handler's other signal, is
    sent in validation by tests/test_validation.py."""
    signum = signal.SIGTERM
    run_dir = tmp_path / "run"
    proc = cli(*small_args(arc_folder, run_dir, "--max_batches", "400", "--epochs", "1", "--save_every", "2"))
    wait_for_checkpoint(run_dir, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-1500:]
    assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err
    step = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
    assert step >= 2
    capsys.readouterr()  # the resumed run in this process: no signal in it, and a start-up the less
    assert training.main(small_args(arc_folder, run_dir, "--max_batches", str(step + 2), "--resume", str(run_dir))) == 0
    assert capsys.readouterr().out.startswith(f"done: {step + 2} steps")


@pytest.mark.slow
def test_sigkill_mid_run_resumes_to_the_uninterrupted_weights(arc_folder, tmp_path, warm_python, capsys):
    """A second fixed.py on the folder of a run that trains is refused; SIGKILL leaves no lock behind: the
    resume goes on, to the weights of a run never stopped."""
    # the runs no signal reaches go in this process
    assert training.main(small_args(arc_folder, tmp_path / "straight", "--max_batches", "8")) == 0
    run_dir = tmp_path / "killed"
    proc = cli(*small_args(arc_folder, run_dir, "--max_batches", "8", "--save_every", "1"))
    wait_for_checkpoint(run_dir, proc)
    # the same folder resumed while the run trains (a requeue in the old job's grace period): refused
    capsys.readouterr()
    assert training.main(small_args(arc_folder, run_dir, "--max_batches", "8", "--resume", str(run_dir))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"in use by pid {proc.pid} on {socket.gethostname()}" in err, err
    assert proc.poll() is None, "the run must still be going when it is killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "checkpoints" / "step_00000008").exists()
    assert training.main(small_args(arc_folder, run_dir, "--max_batches", "8", "--save_every", "1", "--resume",
                                    str(run_dir))) == 0
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "step_00000008" / "model.safetensors"))
    b = load_file(str(run_dir / "checkpoints" / "step_00000008" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_a_different_config_warns_naming_the_fields(small_cfg, tmp_path, capsys):
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=2), torch.device("cpu"))
    capsys.readouterr()
    # epochs, log_every (declared resume_free) and ttt_steps (a validation flag) change nothing learned
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=2, epochs=2, agent_lr=3e-4, clip=0.5,
                             log_every=7, ttt_steps=3, resume=str(tmp_path / "a")), torch.device("cpu"))
    err = capsys.readouterr().err
    said = next(line for line in err.splitlines() if "resuming with a different config" in line)
    assert said == f"warning: resuming with a different config: agent_lr 0.0003 (the checkpoint's: " \
                   f"{small_cfg().optim.agent_lr}), clip 0.5 (the checkpoint's: {small_cfg().optim.clip})", said


def test_a_flag_newer_than_the_checkpoint_is_a_change_only_when_set_off_its_default(small_cfg, tmp_path, capsys):
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=2), torch.device("cpu"))
    ckpt = find_checkpoint(str(tmp_path / "a"))
    state = load_state(ckpt)
    del state["config"]["clip"]  # as a checkpoint written before the flag existed
    torch.save(state, ckpt / STATE_FILE)
    write_checksums(ckpt)
    capsys.readouterr()
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=3, resume=str(tmp_path / "a")),
                torch.device("cpu"))
    assert "different config" not in capsys.readouterr().err
    # (no journal: the step-2 final validation's, written under clip 1.0, would be refused, as it should)
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=4, clip=0.5, resume=str(ckpt), journal=False),
                torch.device("cpu"))
    assert "resuming with a different config: clip" in capsys.readouterr().err


def test_evaluating_a_checkpoint_under_other_optimizer_flags_is_no_change(small_cfg, tmp_path, capsys):
    training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=2), torch.device("cpu"))
    capsys.readouterr()
    training.train(small_cfg(run_dir=str(tmp_path / "b"), eval_only=True, resume=str(tmp_path / "a"), amp="bf16",
                          agent_lr=3e-4, eval_tasks=1, ttt_steps=1), torch.device("cpu"))
    assert "different config" not in capsys.readouterr().err
    training.train(small_cfg(run_dir=str(tmp_path / "c"), eval_only=True, resume=str(tmp_path / "a"), amp="bf16",
                          lambda_c=0.5, eval_tasks=1, ttt_steps=1), torch.device("cpu"))
    assert "resuming with a different config: lambda_c" in capsys.readouterr().err  # TTT trains on the loss


def test_partial_checkpoint_folder_is_never_resumed_from(small_cfg, tmp_path):
    run = tmp_path / "a"
    training.train(small_cfg(run_dir=str(run), max_batches=2), torch.device("cpu"))
    (run / "checkpoints" / ".tmp-step_00000009").mkdir()  # what a kill during a save leaves behind
    assert find_checkpoint(str(run)).name == "step_00000002"


def test_summary_json_is_whole_or_absent_when_the_disk_fills_while_it_is_written(tmp_path, warm_python):
    """summary.json marks a run finished: a write that fails halfway (here the file-size limit, as
    a full disk would) must leave no summary.json and no temporary file, only the error."""
    script = f"""
import resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from engine.distributed import Dist
from engine.run_logger import RunLogger
from training.run_folder import finish_run

run = Path({str(tmp_path)!r})
logger = RunLogger(run, {{}}, "model")
logger.close()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
finish_run(run, logger, 0.0, 3, {{f"eval/metric_{{i}}": float(i) for i in range(200)}}, Dist())
"""
    out = run_command([*warm_python, "-c", script], timeout=120)  # its own process: the file-size limit
    assert out.returncode == 1 and "File too large" in out.stderr, out.stderr[-1000:]
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith("events.out.tfevents")]


def test_the_rl_head_learns_in_a_window_whose_main_step_is_skipped(small_cfg, state_and_batches):
    """A non-finite gradient in the agent skips the main step (its weights untouched); the RL head,
    whose inputs and rewards are the finite micro-batch's and detached, still takes its own step."""
    cfg = small_cfg(grad_accum=1)
    state, batches = state_and_batches(cfg, 1)
    weight = next(state.model.agent.parameters())
    weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    agent_before = weight.detach().clone()
    head = [p for group in state.rl_optimizer.param_groups for p in group["params"]]
    head_before = [p.detach().clone() for p in head]
    stats = train_step(state, batches, cfg)
    assert stats["amp/stepped"] == 0 and stats["amp/nonfinite_losses"] == 0
    assert torch.equal(weight, agent_before)
    assert any(not torch.equal(p, b) for p, b in zip(head, head_before, strict=True))
