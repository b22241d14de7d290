"""The mixed-precision step: every failure of the seeds' GradScaler code, made impossible.

Each test that uses a scaler asserts it is enabled, so none can pass vacuously.
"""

import math
import subprocess
import sys

import pytest
import torch

import training
from engine.precision import MixedPrecision, check_master_weights, slow_precision
from loss_function import training_loss
from prompt import with_qwen_features
from tests.conftest import ROOT

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default


def toy(mode: str):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, MixedPrecision(mode, torch.device("cpu"))


def toy_loss(model):
    x = torch.arange(8.0).view(2, 4) / 8
    return model(x).pow(2).sum()


def forbid_scaler(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a GradScaler method was called")
    for name in ("scale", "unscale_", "step", "update"):
        monkeypatch.setattr(torch.amp.GradScaler, name, boom)


def test_amp_off_makes_no_scaler_call(monkeypatch, small_cfg):
    """docs/invariants.md #5: the leftover window used the scaler with mixed precision off."""
    forbid_scaler(monkeypatch)
    cfg = small_cfg(amp="off", grad_accum=2, max_batches=3)
    summary = training.train(cfg, torch.device("cpu"))
    assert summary["steps"] == 2  # windows of 2 + 1


def test_fp16_grad_accum_partial_window_is_stepped(small_cfg, state_and_batches):
    """docs/invariants.md #1: `No inf checks were recorded` on the partial last window."""
    cfg = small_cfg(amp="fp16", grad_accum=3)
    state, batches = state_and_batches(cfg, 4)  # windows of 3 + 1
    scaler = state.amp.scaler
    assert scaler is not None and scaler.is_enabled()
    calls = []
    real_step = scaler.step
    scaler.step = lambda opt: calls.append(opt) or real_step(opt)
    for window in [batches[:3], batches[3:]]:
        stats = training.train_step(state, window, cfg)
        assert "grad/norm" in stats  # the step routine ran (whether the update applied is the scaler's call)
    assert len(calls) == 2, "both windows, the partial one included, must go through scaler.step"


def test_max_batches_ending_mid_window_runs_through(small_cfg):
    summary = training.train(small_cfg(amp="fp16", grad_accum=2, max_batches=3, epochs=2), torch.device("cpu"))
    assert summary["steps"] == 4  # per epoch: windows of 2 + 1


@pytest.mark.numeric
def test_partial_window_gradient_equals_full_batch_gradient(small_cfg, state_and_batches):
    """docs/invariants.md #2: with --grad_accum 2 and --batch_size 4 (a nominal 8 samples), a window
    of 4 + 2 samples steps with the mean gradient of those 6, computed here directly: one plain
    backward of the mean loss over the concatenated batch, outside train_step. The earlier suite
    divided by the nominal count (8), which gives 6/8 of it."""
    # Only the mean-refinement term, so the RL noise draw cannot differ between the two splits.
    cfg = small_cfg(efe_weight=0.0, mean_weight=1.0, batch_size=4, grad_accum=2, clip=0.0)
    state, batches = state_and_batches(cfg, 2)
    first, second = batches[0], slice_batch(batches[1], 2)
    params = [p for g in state.optimizer.param_groups for p in g["params"]]

    pred = state.model(with_qwen_features(concat_batches(first, second), state.prompts, 0, training=True),
                       "sampled+mean")
    loss = training_loss(pred.logits, pred.refined, pred.prompt, torch.cat([first["target"], second["target"]]),
                         torch.cat([first["input"], second["input"]]), cfg=cfg.loss)
    assert loss.per_sample.shape == (6,)
    reference = torch.autograd.grad(loss.per_sample.mean(), params, allow_unused=True)

    stepped = {}
    state.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: stepped.update(grads=[p.grad.clone() if p.grad is not None else None
                                                               for p in params]))
    training.train_step(state, [first, second], cfg)
    assert sum(g is not None for g in reference) > 10
    for ref, got in zip(reference, stepped["grads"], strict=True):
        if ref is None:
            assert got is None
        else:
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("mode", ["off", "fp16"])
def test_nonfinite_gradient_skips_step_and_keeps_state(mode):
    """docs/invariants.md #3: an inf gradient skips the step; nothing is re-created."""
    model, opt, amp = toy(mode)
    amp.backward(toy_loss(model))
    amp.step(opt, clip=1.0)  # one good step so the optimizer has state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_before = {k: v.clone() for k, v in opt.state[model.weight].items()}
    scaler = amp.scaler
    scale_before = amp.scale
    amp.backward(toy_loss(model))
    model.weight.grad[0, 0] = float("inf")
    result = amp.step(opt, clip=1.0)
    assert not result.stepped and amp.skipped_steps == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    for k, v in opt.state[model.weight].items():
        assert torch.equal(v, state_before[k])
    if mode == "fp16":
        assert amp.scaler is scaler and scaler.is_enabled()
        assert amp.scale == scale_before / 2
    # ... and training goes on.
    amp.backward(toy_loss(model))
    assert amp.step(opt, clip=1.0).stepped


def test_all_nan_window_makes_no_scaler_call(small_cfg, state_and_batches, monkeypatch):
    """docs/invariants.md #1: a window whose every loss is NaN goes backward nowhere and calls no scaler."""
    cfg = small_cfg(amp="fp16", grad_accum=2)
    state, batches = state_and_batches(cfg, 2)
    assert state.amp.scaler.is_enabled()
    with torch.no_grad():
        state.model.agent.head.out.bias.fill_(float("nan"))
    forbid_scaler(monkeypatch)
    stats = training.train_step(state, batches, cfg)
    assert stats["amp/nonfinite_losses"] == 2
    assert stats["amp/stepped"] == 0.0 and "grad/norm" not in stats


def poisoned(batch: dict) -> dict:
    """The batch with NaN numeric features: its prompt, logits and loss are NaN."""
    return {**batch, "numeric": torch.full_like(batch["numeric"], float("nan"))}


def test_nan_in_half_a_window_skips_that_micro_batch_and_steps_on_the_rest(small_cfg, state_and_batches):
    """docs/invariants.md #3: one micro-batch of a window has a NaN loss: it goes backward nowhere,
    is counted, and the window steps on the other one's gradient, every weight finite."""
    cfg = small_cfg(amp="fp16", grad_accum=2, fp16_init_scale=256.0)
    state, (bad, good) = state_and_batches(cfg, 2)
    params = [p for g in state.optimizer.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in params]
    stats = training.train_step(state, [poisoned(bad), good], cfg)
    assert stats["amp/nonfinite_losses"] == 1 and stats["amp/stepped"] == 1.0
    assert all(torch.isfinite(p).all() for p in params)
    assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))


@pytest.mark.numeric
def test_a_window_with_a_dropped_micro_batch_steps_with_the_mean_gradient_of_the_rest(small_cfg, state_and_batches):
    """training/step.py: a micro-batch dropped for a NaN loss does not shrink the step: the window
    [NaN batch, good batch] steps with exactly the gradient of the window [good batch] (the mean over
    the good batch's samples), not half of it."""
    cfg = small_cfg(efe_weight=0.0, mean_weight=1.0, grad_accum=2, clip=0.0)  # no RL draw, no clipping
    grads = []
    for poison in (True, False):
        state, (bad, good) = state_and_batches(cfg, 2)
        params = [p for g in state.optimizer.param_groups for p in g["params"]]
        state.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs, params=params: grads.append(
                [p.grad.clone() if p.grad is not None else None for p in params]))
        stats = training.train_step(state, [poisoned(bad), good] if poison else [good], cfg)
        assert stats["amp/nonfinite_losses"] == poison and stats["amp/stepped"] == 1.0
    assert sum(g is not None for g in grads[1]) > 10
    for got, want in zip(grads[0], grads[1], strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_nan_in_a_partial_last_window_skips_it_and_training_goes_on(small_cfg, state_and_batches, monkeypatch):
    """docs/invariants.md #1 and #3: --grad_accum 2 over 3 micro-batches, the third (a window of
    its own) NaN: no scaler call at all for it, nothing changes, and the next window steps."""
    cfg = small_cfg(amp="fp16", grad_accum=2, fp16_init_scale=256.0)
    state, batches = state_and_batches(cfg, 4)
    assert training.train_step(state, batches[:2], cfg)["amp/stepped"] == 1.0
    weights = [p.detach().clone() for p in state.model.parameters()]
    with monkeypatch.context() as m:
        forbid_scaler(m)
        stats = training.train_step(state, [poisoned(batches[2])], cfg)
    assert stats["amp/nonfinite_losses"] == 1 and stats["amp/stepped"] == 0.0
    main = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    assert all(torch.equal(a, p) for a, p in zip(weights, state.model.parameters(), strict=True) if id(p) in main)
    assert training.train_step(state, [batches[3]], cfg)["amp/stepped"] == 1.0


@pytest.mark.numeric
def test_clip_sees_unscaled_gradients():
    """docs/invariants.md #4: unscale_ before clip_grad_norm_."""
    model, opt, amp = toy("off")
    amp.backward(toy_loss(model))
    reference = amp.step(opt, clip=0.0).grad_norm
    model, opt, amp = toy("fp16")
    assert amp.scaler.is_enabled() and amp.scale == 65536.0
    amp.backward(toy_loss(model))
    result = amp.step(opt, clip=1.0)
    assert math.isclose(result.grad_norm, reference, rel_tol=1e-6)


def test_step_without_gradients_makes_no_scaler_call(monkeypatch):
    """docs/invariants.md #1: scaler.step with no gradient in the window."""
    model, opt, amp = toy("fp16")
    forbid_scaler(monkeypatch)
    assert amp.step(opt, clip=1.0) is None


def test_fp16_master_weights_are_refused():
    """docs/invariants.md #5: fp16 trainable weights fail at start-up, not in unscale_."""
    with pytest.raises(ValueError, match="float32"):
        check_master_weights(list(torch.nn.Linear(2, 2).half().parameters()), "agent")


def slice_batch(batch: dict, n: int) -> dict:
    return {k: v[:n] for k, v in batch.items()}


def concat_batches(a: dict, b: dict) -> dict:
    return {k: torch.cat([a[k], b[k]]) if torch.is_tensor(a[k]) else a[k] + b[k] for k in a}


def test_a_precision_without_native_kernels_on_this_cpu_is_said_in_one_line(monkeypatch):
    """docs: --amp bf16 on a CPU without AVX-512 BF16 or AMX runs emulated, several times slower."""
    cpu = torch.device("cpu")
    zen3 = {"cpu_name": "AMD EPYC 7B13", "avx2": True, "avx512_bf16": False, "amx_bf16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: zen3)
    line = slow_precision("bf16", cpu)
    assert line.startswith("warning: --amp bf16: this CPU (AMD EPYC 7B13) has no native bf16 kernels")
    assert "\n" not in line
    assert slow_precision("off", cpu) is None and slow_precision("bf16", torch.device("cuda")) is None
    assert slow_precision("fp16", cpu).startswith("warning: --amp fp16")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**zen3, "avx512_bf16": True})
    assert slow_precision("bf16", cpu) is None


DENORMALS_IN_EVERY_THREAD = """
import sys, torch, training
if sys.argv[1] == "seeded":
    training.seed_everything(0)
x = torch.full((1 << 22,), 1e-39)  # a denormal float32; large enough for every intra-op thread to take a share
print(int((x * 1.0).count_nonzero()), torch.get_num_threads())
"""


def test_a_run_computes_denormals_as_zero_in_every_thread():
    """A trained start's adaptation ran 1.5x slower on denormal gradients (engine.precision.flush_denormals):
    a process that starts with seed_everything computes them as zero, in every thread of torch's pool
    (set after the pool starts, only the calling thread would), and one that does not keeps them."""
    if not torch.set_flush_denormal(True):  # (what seed_everything has set in this process too)
        pytest.skip("this CPU cannot flush denormals")

    def nonzero(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", DENORMALS_IN_EVERY_THREAD, mode], cwd=ROOT, capture_output=True,
                             text=True, check=True)
        count, threads = out.stdout.split()
        return int(count), int(threads)

    assert nonzero("seeded")[0] == 0
    kept, threads = nonzero("plain")
    assert kept == 1 << 22, (kept, threads)
