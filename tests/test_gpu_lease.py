"""`make gpu-lease` (bench/gpu_lease.py): the one-lease recipe trained and scored, its dry run here on
the CPU at tiny sizes, the same code a GPU's ten minutes run."""

import json

import pytest
import torch

from bench import gpu_lease
from tests.conftest import ROOT, run_command

pytestmark = pytest.mark.usefixtures("warm_bench_children")


def _dry_run(out, re_arc, *extra: str) -> int:
    return gpu_lease.main(["--out", str(out), "--device", "cpu", "--tiny", "--re_arc", str(re_arc[1]),
                           "--train_minutes", "0.02", "--eval_minutes", "0.5", "--minutes", "5", *extra])


def check_whole_lease(out) -> None:
    """A finished dry run's report in `out` (its --copy_to): the run and the untrained start each
    trained (or not) and scored, every figure filled, the views phase, and a few files."""
    report = json.loads((out / "lease.json").read_text())
    run, untrained = report["phases"]
    assert (run["phase"], untrained["phase"]) == ("run", "untrained")
    assert run["status"] == untrained["status"] == "finished"
    assert run["steps"] > 0 and run["model TFLOP/s (whole training)"] > 0 and run["episodes/s (whole training)"] > 0
    assert run["training s"] > 0 and untrained["steps"] == 0 and untrained["training s"] == 0
    for phase in (run, untrained):
        assert phase["tasks scored"] == 4 and phase["held-out pairs"] > 0
        assert phase["pass@2"].endswith(")") and phase["held-out nats/cell before adaptation"][0].isdigit()
    assert "n/a" not in run.values(), run  # every figure filled
    assert float(run["training outside steps (checkpoints, logging)"].rstrip("%")) < 100
    assert "MFU" not in " ".join(run), "no peak on a CPU"
    # the views phase: host and model milliseconds at 8, 64 and 256 views
    assert [line.split(" | ")[0] for line in report["views"][1:]] == ["8", "64", "256"], report["views"]
    assert sorted(p.name for p in out.iterdir()) == ["lease.json", "lease.md", "lease_run.tar.gz", "run.log"]
    assert "| held-out nats/cell before adaptation |" in (out / "lease.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("part", ["training", "heldout", "scoring"])
def test_a_run_stopped_in_any_part_still_reports_what_it_did(tmp_path, re_arc, part):
    """SIGTERM to the run phase's child as it enters each part: its row is read from what the run
    wrote as it went (events, journal), every figure of the parts it passed filled. After the stop in
    training, a second lease in the same folder (a warm machine) sets the first aside and runs whole:
    the dry run trains, scores, scores the untrained start and reports in a few files."""
    # training's marker is the progress bar's loss, written at log steps: every step, since a slow machine makes
    # one step in the 0.02-minute budget (the tiny sizes log every 2nd); scoring's 4 tiny tasks take well under
    # a second: a task a group with 12 adaptation steps each (1.4 s a task here) keeps it going after the first
    # groups are journaled, while the stop comes (polled every 0.1 s)
    timely = {"training": ["--set", "log_every=1"], "heldout": [],
              "scoring": ["--set", "ttt_steps=12", "ttt_small_steps=12", "adapt_tasks=1"]}[part]
    _dry_run(tmp_path, re_arc, "--stop_in", part, "--no-untrained", "--no-views", *timely)
    run, = json.loads((tmp_path / "lease.json").read_text())["phases"]
    assert run["status"].startswith("stopped"), run
    assert run["steps"] > 0 and run["training s"] > 0 and run["episodes/s (whole training)"] > 0
    assert run["model TFLOP/s (whole training)"] > 0 and run["train loss"] != "n/a"
    if part == "heldout":  # stopped in it: the pairs measured before the stop, if any (tiny: one batch of 8)
        assert run["held-out pairs"] == "n/a" or run["held-out pairs"] > 0
    if part == "scoring":  # the held-out loss was passed: whole
        assert run["held-out pairs"] > 0 and run["held-out nats/cell before adaptation"][0].isdigit()
        assert run["tasks scored"] > 0 and run["pass@2"].endswith(")") and run["copy baseline pass@2"] != "n/a"
    if part == "training":  # a second lease on the same folder: the first's phases set aside, then all of it
        assert _dry_run(tmp_path, re_arc, "--copy_to", str(tmp_path / "device-out")) == 0
        assert len(list((tmp_path / "earlier").glob("*/run"))) == 1
        check_whole_lease(tmp_path / "device-out")


def test_the_budgets_shrink_with_the_minutes_the_caller_has(tmp_path):
    (tmp_path / "re_arc.zip").write_bytes(b"")
    whole = gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip")])
    short = gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--minutes", "6"])
    # (6 - 250/60) / (9.5 - 250/60) of each budget: 0.344 (the untrained start's 120 s kept)
    assert (whole.train_minutes, whole.eval_minutes) == (3.3, 2.0)
    assert (short.train_minutes, short.eval_minutes) == (1.13, 0.69)
    freed = gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--minutes", "6", "--no-untrained"])
    assert freed.train_minutes > short.train_minutes  # --no-untrained gives its minutes to training and scoring
    assert whole.train_minutes / whole.eval_minutes == pytest.approx(short.train_minutes / short.eval_minutes, 0.01)
    with pytest.raises(SystemExit):
        gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--minutes", "2"])


def test_the_phases_must_fit_the_lease_and_re_arc_must_be_carried(tmp_path, capsys):
    (tmp_path / "re_arc.zip").write_bytes(b"")
    with pytest.raises(SystemExit):
        gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--train_minutes", "8"])
    assert "do not fit --minutes 9.5" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(SystemExit):
        gpu_lease.parse(["--re_arc", str(tmp_path / "missing.zip")])
    assert "missing.zip: no such file or folder" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(SystemExit):
        gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--set", "compile"])
    assert "give each as FLAG=VALUE" in capsys.readouterr().err.strip().splitlines()[-1]


def test_set_passes_fixed_py_flags_and_booleans_as_their_switches():
    assert gpu_lease.flag_args(["compile=false", "agent_channels=512", "augment=True"]) == [
        "--no-compile", "--agent_channels", "512", "--augment"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_with_one_line(tmp_path, warm_python):
    (tmp_path / "re_arc.zip").write_bytes(b"")
    proc = run_command([*warm_python, "-m", "bench.gpu_lease", "--out", str(tmp_path / "out"), "--re_arc",
                        str(tmp_path / "re_arc.zip")], timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "no CUDA device" in proc.stderr


def test_the_untrained_start_runs_eager_whatever_the_sets_say_of_the_compile(tmp_path):
    """--set compile_backend=aot_eager (a compile failure looked into): the run compiles so, the
    untrained start's validation runs eager, its compile options back at their defaults (each
    needs --compile): EAGER, which the views phase's sets also end with."""
    from training.cli import parse

    (tmp_path / "re_arc.zip").write_bytes(b"")
    args = gpu_lease.parse(["--re_arc", str(tmp_path / "re_arc.zip"), "--device", "cpu", "--set",
                            "compile_backend=aot_eager"])
    run, untrained = (parse(gpu_lease.fixed_argv(args, tmp_path / "run", untrained=u, eval_minutes=1.0)[1:],
                            "fixed.py", "").agent for u in (False, True))
    assert run.compile and run.compile_backend == "aot_eager"
    assert not untrained.compile and untrained.compile_backend == "inductor"
    assert gpu_lease.flag_args(gpu_lease.EAGER) == ["--no-compile", "--compile_backend", "inductor",
                                                    "--compile_mode", "default"]


def test_the_lease_recipe_is_the_joint_recipe_at_a_gpus_speed():
    """configs/gpu-lease.toml: per-task embeddings learned with the evaluation tasks' demos, the rope
    agent in bf16 on one compiled canvas shape with no Qwen in the step, all 400 tasks scored with
    hundreds of voted views and no per-task training, its budgets inside the command's 9.5 minutes."""
    from training.cli import parse

    cfg = parse(["--config", gpu_lease.RECIPE, "--device", "cpu"], "fixed.py", "")
    assert cfg.prompt.task_embedding and cfg.data.train_on_eval_demos and "re-arc:" in cfg.data.data
    assert cfg.agent.agent == "rope" and cfg.agent.compile and cfg.data.canvas == "full" and cfg.optim.amp == "bf16"
    assert not cfg.prompt.use_qwen
    assert cfg.eval.eval_tasks == 0 and cfg.eval.eval_augments >= 256
    assert (cfg.eval.ttt_steps, cfg.eval.ttt_small_steps) == (0, 0), "no task trained on, small or large"
    assert not cfg.eval.view_starts
    defaults = gpu_lease.parse(["--re_arc", str(ROOT / "configs" / "gpu-lease.toml")])  # any existing path
    assert (defaults.train_minutes, defaults.eval_minutes) == (cfg.run.max_minutes, cfg.eval.eval_minutes)
