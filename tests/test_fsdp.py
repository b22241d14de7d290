"""--fsdp on this CPU (gloo): FSDP2 trains as one unsharded process with the whole batch does, its
sharded checkpoints resume at another number of processes and with or without --fsdp, and its
checksums hold."""

import json
import shutil
import subprocess

import pytest
import torch

import training
from engine.checkpoint import LATEST, SHARDED_DIR, find_checkpoint
from tests.conftest import TORCHRUN, WARM_PYTHON_SCRIPT, accelerate_launch, run_command
from tests.test_end_to_end import scalars
from tests.test_multiprocess import args, weights

ACCELERATE_FSDP = accelerate_launch("1x8-fsdp.yaml")
# two epochs of two windows of two micro-batches, a checkpoint after every step, Qwen trained in full
# and re-reading its prompts in every micro-batch; a short validation (it runs on an unsharded copy)
SHORT_TTT = ("--val_every", "end", "--ttt_steps", "3", "--ttt_small_steps", "0", "--ttt_views", "2")
RUN = (*SHORT_TTT, "--epochs", "2", "--max_batches", "4", "--grad_accum", "2", "--prompt_refresh", "1",
       "--qwen_train", "full", "--save_every", "1", "--keep_checkpoints", "0")


def launch(command: list[str]) -> subprocess.CompletedProcess:
    out = run_command(command)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def norms(run_dir) -> dict[int, float]:
    return dict(scalars(run_dir)["grad/norm"])


def keep_until(run_dir, step: int) -> None:
    """The run folder as a run killed after checkpoint `step` left it."""
    root = run_dir / "checkpoints"
    for folder in root.glob("step_*"):
        if int(folder.name[5:]) > step:
            shutil.rmtree(folder)
    (root / LATEST).write_text(f"step_{step:08d}\n")
    (run_dir / "summary.json").unlink()


@pytest.mark.slow
def test_fsdp_trains_like_ddp_and_resumes_at_any_size(arc_folder, tmp_path, capsys, warm_python):
    """Two FSDP processes (launched by accelerate with the repository's FSDP config) reach DDP's
    gradient norms and losses; their checkpoints are sharded. The sharded run's folder as a kill
    after step 2 leaves it resumes there with one process, and one unsharded process's resumes as
    two FSDP processes: each continues as an unbroken run of its own size would. (One process
    differs from two from step 3 on, by design: --canvas fit pads each process's batch to its own
    largest grid. A SIGKILLed run's checkpoint: tests/test_loop_faults.py, the same atomic save.)"""
    one, ddp, fsdp = tmp_path / "one", tmp_path / "ddp", tmp_path / "fsdp"
    assert training.main(args(arc_folder, one, 4, *RUN)[1:]) == 0  # one process: in this one
    launch([*TORCHRUN, WARM_PYTHON_SCRIPT, *args(arc_folder, ddp, 2, *RUN)])
    out = launch([*ACCELERATE_FSDP, WARM_PYTHON_SCRIPT, *args(arc_folder, fsdp, 2, *RUN)])  # the config: --fsdp
    assert "world_size=2 sharded (--fsdp)" in out.stderr
    assert sorted(norms(ddp)) == [1, 2, 3, 4]
    assert norms(fsdp) == pytest.approx(norms(ddp), rel=1e-4)
    for tag in ("loss/combined", "grad/qwen_norm"):
        assert dict(scalars(fsdp)[tag]) == pytest.approx(dict(scalars(ddp)[tag]), rel=1e-4)
    first_two = {k: norms(one)[k] for k in (1, 2)}
    assert {k: norms(ddp)[k] for k in (1, 2)} == pytest.approx(first_two, rel=1e-4)
    assert {k: norms(fsdp)[k] for k in (1, 2)} == pytest.approx(first_two, rel=1e-4)
    a, b = weights(one, 2), weights(ddp, 2)  # unsharded checkpoints, as test_multiprocess.py compares them
    assert any(k.startswith("qwen.") for k in a)
    for k in a:
        if not k.startswith("policy.head."):  # the RL head learns from per-process noise
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    last = fsdp / "checkpoints" / "step_00000004"
    assert (last / SHARDED_DIR / ".metadata").is_file() and not (last / "model.safetensors").exists()
    summary = json.loads((fsdp / "summary.json").read_text())
    assert summary["eval/cell_acc"] == pytest.approx(json.loads((ddp / "summary.json").read_text())["eval/cell_acc"])

    # 2 -> 1: the sharded run cut back to step 2, resumed there by one process with --fsdp
    two_to_one = tmp_path / "two_to_one"
    shutil.copytree(fsdp, two_to_one)
    keep_until(two_to_one, 2)
    step_2 = two_to_one / "checkpoints" / "step_00000002"
    assert (step_2 / SHARDED_DIR).is_dir()
    launch([*warm_python, *args(arc_folder, two_to_one, 4, *RUN, "--fsdp", "--resume", str(step_2))])
    assert norms(two_to_one) == pytest.approx(norms(one), rel=1e-4)  # one process from step 3
    assert (two_to_one / "checkpoints" / "step_00000004" / SHARDED_DIR).is_dir()

    # 1 -> 2: the unsharded run cut back to step 2, resumed by two FSDP processes
    one_to_two = tmp_path / "one_to_two"
    shutil.copytree(one, one_to_two)
    keep_until(one_to_two, 2)
    launch([*TORCHRUN, WARM_PYTHON_SCRIPT, *args(arc_folder, one_to_two, 2, *RUN, "--fsdp", "--resume",
                                                 str(one_to_two))])
    assert norms(one_to_two) == pytest.approx(norms(fsdp), rel=1e-4)
    # ... and a model flag against the checkpoint's is one line, before any shard is touched
    capsys.readouterr()
    assert training.main(args(arc_folder, tmp_path / "wrong", 4, *RUN, "--fsdp", "--agent_channels", "24", "--resume",
                           str(one / "checkpoints" / "step_00000002"))[1:]) == 2
    assert "--agent_channels 24 (the checkpoint's: 16)" in capsys.readouterr().err

    # a sharded checkpoint evaluated by one unsharded process (its Qwen in full, from the checkpoint's
    # flags): the scores the sharded run reported
    capsys.readouterr()
    assert training.main(args(arc_folder, tmp_path / "frozen", 4, "--qwen_train", "frozen", "--eval_only", "--resume",
                              str(fsdp))[1:]) == 2
    assert "--qwen_train frozen (the checkpoint's: full)" in capsys.readouterr().err
    assert training.main(args(arc_folder, tmp_path / "eval", 4, *SHORT_TTT, "--eval_only", "--resume",
                              str(fsdp))[1:]) == 0
    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    scores = [k for k in summary if k.startswith("eval/") and k != "eval/seconds_per_task"]
    assert "eval/ttt_steps_per_task" in scores
    assert {k: evaluated[k] for k in scores} == pytest.approx({k: summary[k] for k in scores})

    # a damaged shard: named, and resuming falls back to the newest intact checkpoint
    shard = sorted((last / SHARDED_DIR).glob("*.distcp"))[1]
    shard.write_bytes(shard.read_bytes()[:-1])
    capsys.readouterr()
    assert find_checkpoint(str(fsdp)).name == "step_00000003"
    assert f"step_00000004 is damaged ({shard} does not match its checksum" in capsys.readouterr().err


def test_fsdp_refuses_what_it_cannot_shard_and_reads_accelerate_configs(monkeypatch):
    from engine.config import Config
    from engine.distributed import launcher_wants_fsdp
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="--fsdp does not take --compile"):
        Config.from_flags(fsdp=True, compile=True, canvas="bucket")
    assert not launcher_wants_fsdp()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match="fsdp_version 1: fixed.py shards with FSDP2"):
        launcher_wants_fsdp()
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert launcher_wants_fsdp()
