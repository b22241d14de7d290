"""The RL head: independent of the main graph (invariant 6), and it learns on a toy bandit."""

import torch

import fixed
from policy_refined import PolicyRefiner


def main_grads(parts):
    return {n: p.grad.clone() for m in (parts.agent, parts.prompt, parts.policy.refiner)
            for n, p in m.named_parameters() if p.grad is not None}


def test_rl_update_after_main_backward_leaves_main_gradients_unchanged(small_cfg, parts_and_batches):
    """Seed 004: `Trying to backward through the graph a second time` from an RL update that
    shared the main graph."""
    cfg = small_cfg()
    parts, (batch,) = parts_and_batches(cfg, 1)
    loss, _, info, reward = fixed.forward_losses(parts, batch, 0, cfg)
    loss.mean().backward()
    before = main_grads(parts)
    main_params = {n: p.detach().clone() for n, p in parts.agent.named_parameters()}
    head_before = [p.detach().clone() for p in parts.policy.head.parameters()]
    parts.policy.update(info, reward)
    parts.policy.update(info, reward)  # twice: it builds its own graph each time
    after = main_grads(parts)
    assert before.keys() == after.keys() and before
    for n in before:
        assert torch.equal(before[n], after[n]), n
    for n, p in parts.agent.named_parameters():
        assert torch.equal(p, main_params[n])
    assert any(not torch.equal(a, b) for a, b in zip(head_before, parts.policy.head.parameters()))
    assert not info.head_input.requires_grad and not info.action.requires_grad


def test_main_loss_sends_no_gradient_into_the_rl_head(small_cfg, parts_and_batches):
    cfg = small_cfg()
    parts, (batch,) = parts_and_batches(cfg, 1)
    loss, *_ = fixed.forward_losses(parts, batch, 0, cfg)
    loss.mean().backward()
    assert all(p.grad is None for p in parts.policy.head.parameters())


def test_reinforce_raises_expected_reward_on_a_bandit():
    """Reward = -||a - a*||^2 for a fixed best action a*: the mean must move towards a*."""
    torch.manual_seed(0)
    policy = PolicyRefiner(prompt_dim=8, ctrl_dim=3, feat_dim=15, rank=2, rl_lr=0.05, seed=0)
    best = torch.tensor([0.5, -0.5])
    prompt, ctrl, feat = torch.zeros(64, 8), torch.zeros(64, 3), torch.zeros(64, 15)

    def expected_reward():
        with torch.no_grad():
            mu, std = policy.head(policy._head_input(prompt, ctrl, feat))
            return -((mu - best).pow(2).sum(-1) + std.pow(2).sum()).mean().item()

    start = expected_reward()
    for _ in range(200):
        _, _, info = policy.refine_prompt(prompt, ctrl, feat)
        policy.update(info, -(info.action - best).pow(2).sum(-1))
    assert expected_reward() > start + 0.3, (start, expected_reward())
