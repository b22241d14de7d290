"""The RL head: independent of the main graph (docs/invariants.md #6), and it learns on a toy bandit."""

import torch

from loss_function import training_loss
from policy_refined import PolicyRefiner
from prompt import with_qwen_features


def forward_loss(state, batch, cfg):
    pred = state.model(with_qwen_features(batch, state.prompts, 0, training=True), "sampled+mean")
    loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    return pred, loss


def main_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_rl_update_after_main_backward_leaves_main_gradients_unchanged(small_cfg, state_and_batches):
    """`Trying to backward through the graph a second time` came from an RL update that shared the
    main graph (docs/invariants.md #6)."""
    cfg = small_cfg()
    state, (batch,) = state_and_batches(cfg, 1)
    model = state.model
    pred, loss = forward_loss(state, batch, cfg)
    loss.per_sample.mean().backward()
    before = main_grads(model)
    agent_before = {n: p.detach().clone() for n, p in model.agent.named_parameters()}
    head_before = [p.detach().clone() for p in model.parameter_groups()["rl_head"]]
    model.rl_update(pred.rl, loss.reward, state.rl_optimizer)
    model.rl_update(pred.rl, loss.reward, state.rl_optimizer)  # twice: it builds its own graph each time
    after = {n: g for n, g in main_grads(model).items() if not n.startswith("policy.head.")}
    assert before.keys() == after.keys() and before
    for n in before:
        assert torch.equal(before[n], after[n]), n
    for n, p in model.agent.named_parameters():
        assert torch.equal(p, agent_before[n])
    assert any(not torch.equal(a, b) for a, b in zip(head_before, model.parameter_groups()["rl_head"], strict=True))
    assert not pred.rl.head_input.requires_grad and not pred.rl.action.requires_grad


def test_main_loss_sends_no_gradient_into_the_rl_head(small_cfg, state_and_batches):
    cfg = small_cfg()
    state, (batch,) = state_and_batches(cfg, 1)
    _, loss = forward_loss(state, batch, cfg)
    loss.per_sample.mean().backward()
    assert all(p.grad is None for p in state.model.parameter_groups()["rl_head"])


def test_no_parameter_is_in_both_optimizers(small_cfg, state_and_batches):
    state, _ = state_and_batches(small_cfg(qwen_train="full"), 0)
    main = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    rl = {id(p) for g in state.rl_optimizer.param_groups for p in g["params"]}
    assert main and rl and not main & rl
    trained = {id(p) for p in state.model.parameters() if p.requires_grad}
    assert main | rl == trained, "every trainable weight is in exactly one optimizer"


def test_reinforce_raises_expected_reward_on_a_bandit():
    """Reward = -||a - a*||^2 for a fixed best action a*: the mean must move towards a*."""
    torch.manual_seed(0)
    policy = PolicyRefiner(prompt_dim=8, ctrl_dim=3, feat_dim=15, rank=2, seed=0)
    optimizer = torch.optim.Adam(policy.head.parameters(), lr=0.05)
    best = torch.tensor([0.5, -0.5])
    prompt, ctrl, feat = torch.zeros(64, 8), torch.zeros(64, 3), torch.zeros(64, 15)

    def expected_reward():
        with torch.no_grad():
            mu, std = policy.head(policy._head_input(prompt, ctrl, feat))
            return -((mu - best).pow(2).sum(-1) + std.pow(2).sum()).mean().item()

    start = expected_reward()
    for _ in range(200):
        _, info = policy.refinements(prompt, ctrl, feat, "sampled")
        policy.update(info, -(info.action - best).pow(2).sum(-1), optimizer)
    assert expected_reward() > start + 0.3, (start, expected_reward())


def test_refinements_by_name():
    """mean draws no noise (validation never shifts the training stream); sampled+mean is [2, B, P]
    with the mean second; zero is the all-zero prompt."""
    policy = PolicyRefiner(prompt_dim=8, ctrl_dim=3, feat_dim=15, rank=2, seed=0)
    with torch.no_grad():
        policy.head.log_std.fill_(0.0)
    prompt, ctrl, feat = torch.randn(5, 8), torch.rand(5, 3), torch.rand(5, 15)
    noise = policy.noise.get_state()
    mean, info = policy.refinements(prompt, ctrl, feat, "mean")
    assert info is None and torch.equal(policy.noise.get_state(), noise)
    both, info = policy.refinements(prompt, ctrl, feat, "sampled+mean")
    assert both.shape == (2, 5, 8) and torch.equal(both[1], mean[0]) and not torch.equal(both[0], both[1])
    # the sampled delta lies in the span of the basis: sampled - mean = U (a - mu)
    delta = both[0] - both[1]
    torch.testing.assert_close(delta, delta @ policy.basis @ policy.basis.T, rtol=1e-5, atol=1e-5)
    zero, _ = policy.refinements(prompt, ctrl, feat, "zero")
    assert torch.equal(zero, torch.zeros(1, 5, 8))
