"""ArcModel, the one model object: its forward, its parameter groups and what a checkpoint holds."""

import pytest
import torch

from loss_function import training_loss
from prompt import with_qwen_features


def model_and_batch(small_cfg, state_and_batches, **flags):
    cfg = small_cfg(**flags)
    state, (batch,) = state_and_batches(cfg, 1)
    return cfg, state, with_qwen_features(batch, state.prompts, 0, training=False)


@pytest.mark.parametrize("agent", ["conv", "rope"])
def test_both_refinements_in_one_agent_call_give_the_gradients_of_two_calls(agent, small_cfg, state_and_batches):
    """The sampled and the mean refinement run as ONE agent call on a doubled batch; the loss and
    every gradient equal those of two separate agent calls."""
    cfg, state, batch = model_and_batch(small_cfg, state_and_batches, agent=agent)
    model = state.model

    def grads_after(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    noise = model.rl_noise_state()
    pred = model(batch, "sampled+mean")
    one_call = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    one = grads_after(one_call.per_sample.sum())

    model.set_rl_noise_state(noise)  # the same sampled delta
    pred = model(batch, "sampled+mean")
    logits = torch.stack([model.agent(batch["input"], pred.refined[0]), model.agent(batch["input"], pred.refined[1])])
    two_calls = training_loss(logits, pred.refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    two = grads_after(two_calls.per_sample.sum())

    torch.testing.assert_close(one_call.per_sample, two_calls.per_sample)
    assert one.keys() == two.keys() and any(n.startswith("prompt.") for n in one)
    for name in one:
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6, msg=name)


def test_forward_shapes_and_the_named_refinements(small_cfg, state_and_batches):
    cfg, state, batch = model_and_batch(small_cfg, state_and_batches)
    b, side = batch["input"].shape[:2]
    mean = state.model(batch)
    assert mean.logits.shape == (1, b, side, side, 12) and mean.refined.shape == (1, b, cfg.prompt.prompt_dim)
    assert mean.rl is None
    both = state.model(batch, "sampled+mean")
    assert both.logits.shape[0] == 2 and both.rl is not None
    torch.testing.assert_close(both.logits[1], mean.logits[0])  # the mean refinement draws no noise
    # each slice is named: training's sampled refinement first, then the mean; adaptation's is the mean
    assert (both.names, mean.names) == (("sampled", "mean"), ("mean",))
    assert torch.equal(both.of("mean")[0], both.logits[1]) and torch.equal(both.of("sampled")[1], both.refined[0])
    with pytest.raises(ValueError, match="no 'sampled' refinement in this prediction: it holds mean"):
        mean.of("sampled")


def test_parameter_groups_partition_the_trainable_weights(small_cfg, state_and_batches):
    cfg, state, _ = model_and_batch(small_cfg, state_and_batches, qwen_train="lora")
    groups = state.model.parameter_groups()
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)), "a parameter in two groups"
    assert set(ids) == {id(p) for p in state.model.parameters() if p.requires_grad}
    assert groups["qwen"] and all("lora_" in n for n, p in state.model.named_parameters()
                                  if any(p is q for q in groups["qwen"]))
    chosen = {id(p) for p in state.model.ttt_parameters()}
    assert chosen and not chosen & {id(p) for p in groups["qwen"] + groups["rl_head"]}


def test_trainable_state_leaves_out_the_frozen_trunk_and_loads_back(small_cfg, state_and_batches):
    _, state, _ = model_and_batch(small_cfg, state_and_batches)
    saved = {k: v.clone() for k, v in state.model.trainable_state().items()}  # the state shares storage
    assert not any(k.startswith("qwen.") for k in saved)
    assert any(k.startswith("policy.head.") for k in saved) and "policy.head.baseline" in saved
    with torch.no_grad():
        for p in state.model.agent.parameters():
            p.add_(1.0)
    assert not torch.equal(saved["agent.head.out.bias"], state.model.state_dict()["agent.head.out.bias"])
    state.model.load_trainable_state(saved)
    assert all(torch.equal(v, state.model.state_dict()[k]) for k, v in saved.items())
    del saved["agent.head.out.bias"]
    with pytest.raises(ValueError, match="missing .*agent.head.out.bias"):
        state.model.load_trainable_state(saved)


def test_an_agent_under_cuda_graphs_returns_logits_a_later_call_cannot_overwrite(small_cfg, state_and_batches):
    """--compile_mode reduce-overhead: each agent call is marked a step of its own and its logits
    copied out of the graph's buffers (on a CPU the graphs are not made; the same values, a new
    tensor), so the model trains and predicts as the eager one does."""
    from model import build_model

    cfg, state, batch = model_and_batch(small_cfg, state_and_batches)
    flags = dict(compile=True, compile_mode="reduce-overhead", canvas="full", adapt_tasks=1)
    assert build_model(small_cfg(**flags), qwen=state.model.qwen).cuda_graphs
    assert not state.model.cuda_graphs
    plain = state.model(batch, "mean").logits
    state.model.cuda_graphs = True  # the eager agent, through the graphs' path
    first, second = state.model(batch, "mean").logits, state.model(batch, "mean").logits
    torch.testing.assert_close(first, plain)
    assert first.data_ptr() != second.data_ptr()
