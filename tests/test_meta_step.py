"""training/meta_step.py (--meta_steps): first-order MAML inside the training step."""

import copy

import pytest
import torch

import training
from engine.config import Config
from engine.distributed import Dist
from engine.errors import ConfigError
from engine.run_logger import read_scalars
from loss_function import adaptation_loss
from tests.conftest import CPU
from training.meta_step import episode_rows, meta_gradient


def _encoded(state, batch):
    return state.model.encode_prompts(batch, state.prompts, 0, training=True)


def _by_hand(model, batch: dict, cfg: Config) -> dict[str, torch.Tensor]:
    """Episode 0's first-order gradient by another route: a deep copy of the module adapted by a
    torch.optim.Adam over its own parameters, the query's loss differentiated there."""
    fast = copy.deepcopy(model)
    params = fast.ttt_parameters(cfg.optim.meta_params)
    inner = torch.optim.Adam(params, lr=cfg.optim.meta_lr)
    n = min(int(batch["context_present"][0].sum()), cfg.optim.meta_demos)
    context = {**episode_rows(batch, 0, n), "input": batch["context_input"][0, :n],
               "target": batch["context_target"][0, :n]}
    query = {**episode_rows(batch, 0, 1), "input": batch["input"][:1], "target": batch["target"][:1]}

    def loss(b):
        pred = fast(b, "mean")
        return adaptation_loss(pred.logits[0], pred.refined[0], pred.prompt, b["target"], b["input"],
                               cfg=cfg.loss).mean()

    for _ in range(cfg.optim.meta_steps):
        inner.zero_grad()
        loss(context).backward()
        inner.step()
    grads = torch.autograd.grad(loss(query), params, allow_unused=True)
    names = {id(p): n for n, p in fast.named_parameters()}
    return {names[id(p)]: g for p, g in zip(params, grads, strict=True) if g is not None}


def test_the_meta_gradient_is_the_query_gradient_at_the_adapted_copy(small_cfg, state_and_batches):
    cfg = small_cfg(meta_steps=3, meta_tasks=1, meta_lr=1e-2, meta_weight=0.5)
    state, (batch,) = state_and_batches(cfg, 1)
    batch = _encoded(state, batch)
    model = state.model
    expected = _by_hand(model, batch, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = meta_gradient(model, batch, cfg, state.amp, [batch])  # --meta_weight over 1 meta episode
    assert stats["meta/episodes"] == 1
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads) == set(expected)
    for name, g in expected.items():
        torch.testing.assert_close(grads[name], 0.5 * g, rtol=1e-4, atol=1e-6, msg=name)
    for name, p in model.named_parameters():  # the shared weights do not move: only .grad is added to
        assert torch.equal(p, before[name]), name


def test_the_inner_steps_never_read_the_query_output(small_cfg, state_and_batches):
    cfg = small_cfg(meta_steps=2, meta_tasks=2)
    state, (batch,) = state_and_batches(cfg, 1)
    batch = _encoded(state, batch)
    first = meta_gradient(state.model, batch, cfg, state.amp, [batch])
    state.model.zero_grad(set_to_none=True)
    changed = {**batch, "target": (batch["target"] + 1) % 10}  # every query output changed
    second = meta_gradient(state.model, changed, cfg, state.amp, [changed])
    for key in ("meta/context_loss_before", "meta/context_loss_after"):
        assert torch.equal(first[key], second[key]), key
    assert not torch.equal(first["meta/query_loss"], second["meta/query_loss"])


def test_a_run_with_meta_steps_trains_logs_and_resumes(small_cfg, tmp_path):
    cfg = small_cfg(meta_steps=2, meta_tasks=2, max_batches=4, val_every="end", eval_tasks=1, ttt_steps=1)
    summary = training.train(cfg, CPU)
    assert torch.isfinite(torch.tensor(summary["loss/combined"]))
    tags = read_scalars(tmp_path / "run")
    assert len(tags["meta/query_loss"]) == 4 and all(v == v for _, v in tags["meta/query_loss"])
    resumed = training.train(small_cfg(meta_steps=2, meta_tasks=2, max_batches=4, epochs=2, val_every="end",
                                       eval_tasks=1, ttt_steps=1, resume=str(tmp_path / "run")), CPU)
    assert resumed["steps"] == 8


@pytest.mark.parametrize("flags, message", [
    (dict(meta_steps=2, amp="fp16"), "--amp fp16"),
    (dict(meta_steps=2, fsdp=True), "--fsdp"),
    (dict(meta_steps=2, latent_step_lr=1.0), "--latent_step_lr"),
    (dict(meta_steps=2, meta_tasks=0), "--meta_tasks"),
])
def test_meta_steps_refuse_what_they_cannot_do(flags, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_flags(**flags)


def test_meta_steps_refuse_several_processes(small_cfg):
    with pytest.raises(ConfigError, match="one process, not 2"):
        training.build_train_state(small_cfg(meta_steps=2), CPU, Dist(rank=0, world_size=2))
