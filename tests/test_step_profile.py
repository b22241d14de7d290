"""bench/step_profile.py's reading of a profile: the phases' host seconds and the device activity
from the profiler's raw events, as torch's key_averages sums them."""

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from bench.step_profile import PHASES, RecordedEvent, device_activity, phase_seconds, recorded


def test_the_raw_events_sum_to_what_key_averages_gives():
    a = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("step/forward"):
                loss = (a @ a).tanh().sum()
            with record_function("step/backward"):
                loss.backward()
            with record_function("not/a_phase"):
                a.detach().mul_(1.0)
    events = recorded(prof)
    averages = prof.key_averages()
    expected = {e.key: e.cpu_time_total / 1e6 / 3 for e in averages if e.key in PHASES}
    assert set(expected) == {"step/forward", "step/backward"}
    assert phase_seconds(events, 3) == pytest.approx(expected, rel=1e-6)
    for op in ("aten::mm", "aten::tanh", "step/forward"):
        assert sum(e.name == op for e in events) == next(e.count for e in averages if e.key == op)
    assert device_activity(events, 3) == {"kernels": 0, "gpu busy": 0, "syncs": 0, "sync wait": 0}


def test_device_activity_counts_launches_syncs_and_kernel_time_per_step():
    """The names the CUDA runtime records: launches, synchronizations and copies on the host, kernels
    and the phases' GPU-side copies on the device (not kernel time)."""
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [RecordedEvent(*e) for e in [
        ("cudaLaunchKernel", cpu, 1e-6, False), ("cuLaunchKernelEx", cpu, 1e-6, False),
        ("cudaStreamSynchronize", cpu, 0.004, False), ("cudaMemcpyAsync", cpu, 0.002, False),
        ("void gemm_kernel<float>", cuda, 0.010, False), ("Memcpy DtoH", cuda, 0.001, False),
        ("step/forward", cuda, 0.5, True), ("step/forward", cpu, 0.25, True)]]
    assert device_activity(events, 2) == pytest.approx({"kernels": 1.0, "gpu busy": 0.0055, "syncs": 1.0,
                                                        "sync wait": 0.003})
    assert phase_seconds(events, 2) == pytest.approx({"step/forward": 0.125})
