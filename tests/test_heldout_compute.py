"""bench/heldout_compute.py: the held-out loss against training FLOPs over runs of several widths,
the frontier's power law and what it predicts for a recipe."""

import math
import xml.etree.ElementTree as ET

import torch
from torch.utils.flop_counter import FlopCounterMode

import training
from agents import build_agent
from bench import heldout_compute
from bench.heldout_curve import power_fit, predict
from training.flops import episode_flops


def test_the_frontier_keeps_each_point_below_every_cheaper_one():
    points = [{"pflop": c, "eval": e} for c, e in ((1, 2.0), (2, 2.5), (3, 1.5), (4, 1.6), (5, 1.0))]
    assert [p["pflop"] for p in heldout_compute.frontier(points)] == [1, 3, 5]


def test_the_prediction_interval_is_exact_on_an_exact_law_and_widens_away_from_the_points():
    exact = power_fit([1, 10, 100], [2.0 * x ** -0.2 for x in (1, 10, 100)])
    y, lo, hi = predict(exact, 1e4)
    assert math.isclose(y, 2.0 * 1e4 ** -0.2, rel_tol=1e-9) and math.isclose(lo, hi, rel_tol=1e-9)
    noisy = power_fit([1, 10, 100, 1000], [2.0, 1.4, 1.3, 0.8])
    near, far = predict(noisy, 30), predict(noisy, 1e6)
    assert near[1] < near[0] < near[2]
    assert math.log(far[2] / far[1]) > math.log(near[2] / near[1])


def test_a_micro_batch_costs_its_episodes_times_one_episode_at_its_side(small_cfg, state_and_batches):
    cfg = small_cfg()
    _, batches = state_and_batches(cfg, 2)
    agent = build_agent(cfg.agent, prompt_dim=cfg.prompt.prompt_dim)
    for batch in batches:
        grid = torch.cat([batch["input"], batch["input"]])  # both refinements, as the step runs them
        with FlopCounterMode(display=False) as counter:
            agent(grid, torch.randn(grid.shape[0], cfg.prompt.prompt_dim)).float().logsumexp(-1).mean().backward()
        episodes, side = batch["input"].shape[:2]
        assert counter.get_total_flops() == episodes * episode_flops(cfg, side)
    wider = small_cfg(agent_channels=32)
    assert episode_flops(wider, 11) > 3 * episode_flops(cfg, 11)
    assert heldout_compute.step_flops(cfg, windows=2) > 0


def test_runs_of_two_widths_make_a_table_a_fit_a_prediction_and_a_picture(small_cfg, tmp_path, capsys):
    runs = []
    for width in (8, 16):
        cfg = small_cfg(run_dir=str(tmp_path / f"width{width}"), agent_channels=width, max_batches=6, val_every="2",
                        val_share=1e9, val_tasks=1, eval_tasks=1, ttt_steps=1, hold_out_tests=3)
        runs.append(training.train(cfg, torch.device("cpu"))["run_dir"])
    picture = tmp_path / "fit.svg"
    heldout_compute.main([*runs, "--windows", "2", "--svg", str(picture), "--predict", "configs/smoke.toml",
                          "--predict_set", f"data={small_cfg().data.data}", "agent_channels=16", "prompt_dim=32",
                          "--gpu_hours", "1", "--seconds_per_step", "0.5"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| width")]
    assert len(rows) == 6 and {r[1].strip() for r in rows} == {"8", "16"}  # three validations a run
    flops = {r[1].strip(): float(r[3]) for r in rows}
    assert flops["16"] > flops["8"] > 0
    assert "configs/smoke.toml:" in out and "7,200 steps in 1 GPU-hours" in out
    ET.parse(picture)
