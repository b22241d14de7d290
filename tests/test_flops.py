"""training/flops.py: a run's model FLOPs, counted by torch, and their rate."""

import pytest
import torch

import training
from engine.run_logger import read_scalars
from training import flops
from training.flops import TrainingFlops, bf16_peak_tflops, episode_flops


def test_a_window_costs_each_micro_batch_its_episodes_times_one_episode_at_its_side(small_cfg, monkeypatch):
    """Micro-batches of 3 episodes at side 5 and 2 at side 7: 3 f(5) + 2 f(7) FLOPs, each side counted
    once; 5 episodes over 2 s (the clock moved by hand) are 2.5 a second; torch's random stream is
    left as it was (counting builds an agent)."""
    cfg = small_cfg()
    flops._counted.cache_clear()  # counted here, not by an earlier test
    counted = TrainingFlops(cfg, torch.device("cpu"))
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(flops.time, "time", lambda: next(clock))
    counted.restart_interval()
    window = [{"input": torch.zeros(3, 5, 5, dtype=torch.long)}, {"input": torch.zeros(2, 7, 7, dtype=torch.long)}]
    state = torch.random.get_rng_state()
    counted.add(window)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert counted.total == 3 * episode_flops(cfg, 5) + 2 * episode_flops(cfg, 7) and set(counted.per_side) == {5, 7}
    rates = counted.interval()
    assert rates["perf/episodes_per_second"] == pytest.approx(2.5)
    assert rates["perf/model_tflops"] == pytest.approx(counted.total / 2 / 1e12)
    assert "perf/mfu" not in rates, "no peak on a CPU"
    assert episode_flops(cfg, 7) > episode_flops(cfg, 5) > 0


def test_a_count_is_made_once_a_process_for_each_agent_and_side(small_cfg, monkeypatch):
    """Runs of the same agent in one process (a bench's rows, the tests) count each side once; another
    side or width is counted anew, and --compile (its scope, backend and mode too) is not part of the agent counted."""
    flops._counted.cache_clear()
    built = []
    real = flops.build_agent
    monkeypatch.setattr(flops, "build_agent", lambda cfg, **kw: built.append(cfg.agent_channels) or real(cfg, **kw))
    cfg = small_cfg()
    first = episode_flops(cfg, 6)
    compiled = small_cfg(compile=True, canvas="bucket", compile_scope="blocks")
    captured = small_cfg(compile=True, canvas="bucket", compile_backend="aot_eager")
    assert episode_flops(cfg, 6) == episode_flops(compiled, 6) == episode_flops(captured, 6) == first
    assert built == [16]
    assert episode_flops(cfg, 7) > first and episode_flops(small_cfg(agent_channels=24), 6) > first
    assert built == [16, 16, 24]


def test_mfu_is_the_share_of_the_given_peak():
    counted = TrainingFlops.__new__(TrainingFlops)
    counted.peak = 2.0
    assert counted.rates(int(3e12), 6, 3.0, "x_") == {"x_model_tflops": 1.0, "x_episodes_per_second": 2.0, "x_mfu": 0.5}
    assert bf16_peak_tflops(torch.device("cpu")) is None and bf16_peak_tflops(torch.device("cpu"), 790.0) == 790.0


def test_a_run_logs_its_model_flops_a_second_and_sums_them_in_its_summary(small_cfg, tmp_path):
    cfg = small_cfg(max_batches=3, log_every=1, run_dir=str(tmp_path / "run"))
    summary = training.train(cfg, torch.device("cpu"))
    assert summary["train_pflop"] > 0 and summary["train_model_tflops"] > 0 and summary["train_episodes_per_second"] > 0
    scalars = read_scalars(tmp_path / "run")
    assert len(scalars["perf/model_tflops"]) >= 3 and all(v > 0 for _, v in scalars["perf/episodes_per_second"])
