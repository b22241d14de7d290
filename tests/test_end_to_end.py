"""The real fixed.py, run as a user runs it, then what it wrote read back."""

import json

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import training
from engine.checkpoint import load_state
from engine.run_logger import read_scalars
from tests.conftest import run_command

REQUIRED_TAGS = {"loss/combined", "loss/efe", "rl/reward", "train/mask_ratio", "grad/norm", "grad/qwen_norm",
                 "amp/scale", "amp/skipped_steps", "optim/lr_factor", "eval/cell_acc", "eval/exact", "eval/pass2",
                 "eval/oracle", "eval/task_score",
                 "eval/ttt_steps_per_task", "eval/copy_cell_acc", "val/pass2", "cache/hits",
                 "cache/qwen_tokens_encoded"}


scalars = read_scalars  # {tag: [(step, value), ...]} of a run folder


@pytest.mark.slow
def test_two_batch_run_writes_events_checkpoint_and_resumes(arc_folder, tmp_path, capsys, warm_python):
    run_dir = tmp_path / "run"
    common = ["--data", str(arc_folder), "--max_batches", "2", "--log_every", "1", "--batch_size", "4",
              "--run_dir", str(run_dir), "--ttt_small_steps", "0"]
    out = run_command([*warm_python, "fixed.py", *common, "--ttt_steps", "2"])  # (the defaults: tests/test_recipe.py)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("done: 2 steps (") and "s of training, " in out.stdout and str(run_dir) in out.stdout
    assert "UNTRAINED" in out.stderr, "the tiny Qwen must be named as untrained"

    tags = scalars(run_dir)
    assert REQUIRED_TAGS <= tags.keys(), REQUIRED_TAGS - tags.keys()
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    images = events.Tags()["images"]
    assert images and all(t.startswith("tasks/") for t in images)  # the evaluation tasks, drawn
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"max_batches": 2' in config and '"data": "' in config
    assert [s for s, _ in tags["loss/combined"]] == [1, 2]
    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    weights = load_file(str(ckpt / "model.safetensors"))
    assert any(k.startswith("agent.") for k in weights) and any(k.startswith("policy.head.") for k in weights)
    assert not any(k.startswith("qwen.") for k in weights), "a frozen trunk is not saved"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["eval/cell_acc"] <= 1

    # validation flags may change on resume: this one adapts each task for 4 steps (the first run: 2);
    # resumed in this process (fixed.py's own start was tested above)
    capsys.readouterr()
    assert training.main([*common, "--epochs", "2", "--ttt_steps", "4", "--resume", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("done: 4 steps")
    assert f"(training on from {ckpt} (step 2))" in err, "the start-up names what it resumes"
    assert "validation: none during training" in err, "the one epoch left gets the final validation alone"
    assert [s for s, _ in scalars(run_dir)["loss/combined"]][-2:] == [3, 4]


def test_same_seed_same_losses(small_cfg, tmp_path):
    """docs/invariants.md #9, first half: two runs with one seed give identical losses."""
    a = training.train(small_cfg(run_dir=str(tmp_path / "a")), torch.device("cpu"))
    b = training.train(small_cfg(run_dir=str(tmp_path / "b")), torch.device("cpu"))
    assert scalars(a["run_dir"])["loss/combined"] == scalars(b["run_dir"])["loss/combined"]


@pytest.mark.slow
@pytest.mark.parametrize("lr_schedule", ["constant", "cosine"])
def test_resume_mid_epoch_gives_the_same_weights(small_cfg, tmp_path, lr_schedule):
    """docs/invariants.md #9, second half: 4 steps straight == 2 steps, resume, 2 more (bit-identical);
    under a decaying lr too (the checkpoint holds decayed lrs; the schedule's base is the flags')."""
    straight = training.train(small_cfg(run_dir=str(tmp_path / "a"), max_batches=4, lr_schedule=lr_schedule),
                           torch.device("cpu"))
    half = small_cfg(run_dir=str(tmp_path / "b"), max_batches=4, save_every=2, lr_schedule=lr_schedule)
    training.train(half, torch.device("cpu"))
    ckpt_2 = tmp_path / "b" / "checkpoints" / "step_00000002"
    resumed = training.train(small_cfg(run_dir=str(tmp_path / "c"), max_batches=4, resume=str(ckpt_2),
                                    lr_schedule=lr_schedule), torch.device("cpu"))
    assert straight["steps"] == resumed["steps"] == 4
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000004" / "model.safetensors"))
    wc = load_file(str(tmp_path / "c" / "checkpoints" / "step_00000004" / "model.safetensors"))
    assert wa.keys() == wc.keys()
    for k in wa:
        assert torch.equal(wa[k], wc[k]), k


@pytest.mark.slow
def test_resume_under_fp16_with_accumulation_and_a_trainable_qwen_gives_the_same_state(small_cfg, tmp_path):
    """docs/invariants.md #9 where most state is: --amp fp16 (the GradScaler's scale and growth
    tracker), --grad_accum 2, LoRA on Qwen with refreshes. 4 steps straight == 2, resume, 2 more:
    the same weights, optimizer moments and scaler state, bit for bit."""
    flags = dict(amp="fp16", grad_accum=2, qwen_train="lora", prompt_refresh=2, qwen_lr=1e-3, max_batches=8,
                 fp16_init_scale=1024.0, val_every="end", eval_tasks=1, ttt_steps=1)
    training.train(small_cfg(run_dir=str(tmp_path / "a"), **flags), torch.device("cpu"))
    training.train(small_cfg(run_dir=str(tmp_path / "b"), save_every=2, **flags), torch.device("cpu"))
    ckpt_2 = tmp_path / "b" / "checkpoints" / "step_00000002"
    training.train(small_cfg(run_dir=str(tmp_path / "c"), resume=str(ckpt_2), **flags), torch.device("cpu"))
    a, c = (tmp_path / name / "checkpoints" / "step_00000004" for name in ("a", "c"))
    wa, wc = load_file(str(a / "model.safetensors")), load_file(str(c / "model.safetensors"))
    assert any(k.startswith("qwen.") and "lora_" in k for k in wa)
    assert wa.keys() == wc.keys() and all(torch.equal(wa[k], wc[k]) for k in wa)
    sa, sc = (load_state(d) for d in (a, c))
    assert sa["amp"]["scaler"]["scale"] == sc["amp"]["scaler"]["scale"]
    assert sa["amp"]["scaler"]["_growth_tracker"] == sc["amp"]["scaler"]["_growth_tracker"] == 4
    moments = [(s["optimizer"]["state"][i]["exp_avg"], s["optimizer"]["state"][i]["exp_avg_sq"])
               for s in (sa, sc) for i in sorted(s["optimizer"]["state"])]
    half = len(moments) // 2
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(moments[:half], moments[half:], strict=True))
