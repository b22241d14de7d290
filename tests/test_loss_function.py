"""EFE loss against numbers worked by hand."""

import math

import pytest
import torch

from data.canvas import PAD
from engine.config import LossCfg
from loss_function import efe_loss, training_loss

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default
pytestmark = pytest.mark.numeric

C = 12


def one_cell_case():
    """Canvas of 1x2: cell 0 holds colour 3 in input and target; cell 1 is PAD in both (excluded)."""
    logits = torch.zeros(1, 1, 2, C, requires_grad=True)  # q uniform: 1/12 per class
    target = torch.tensor([[[3, PAD]]])
    inp = torch.tensor([[[3, PAD]]])
    prompt = torch.zeros(1, 2)
    refined = torch.tensor([[3.0, 4.0]])  # ||refined - prompt||^2 = 25
    return logits, target, inp, refined, prompt


def test_efe_matches_hand_worked_value():
    logits, target, inp, refined, prompt = one_cell_case()
    out = efe_loss(logits, target, inp, refined, prompt, cfg=LossCfg())
    # Defaults: smoothing 0.1, eps 0.01, lambda_r 0.1, lambda_a 0.01, lambda_c 1e-3, hard_weight 2.
    # risk = -sum_c pref(c) log(1/12) = log 12                                   = 2.4849066
    # KL(q || p_eps): p_eps(target) = 0.99 + 0.01/12, p_eps(other) = 0.01/12
    #   = log(1/12) - (1/12) (log(0.9908333) + 11 log(0.0008333))                = 4.0150979
    # H[q] = log 12                                                              = 2.4849066
    # cell = 2.4849066 + 0.1 * 4.0150979 + 0.01 * 2.4849066                      = 2.9112655
    # uniform argmax is class 0 != 3: wrong, so hard (weight 2) and mask_ratio = 1/1
    # efe = (0.5 + 0.5 * 1) * 2 * 2.9112655 / 1 + 1e-3 * 25                      = 5.8475310
    assert out.per_sample.shape == (1,)
    assert out.per_sample.item() == pytest.approx(5.8475310, abs=1e-5)
    assert out.mask_ratio.item() == 1.0
    assert out.parts["risk"].item() == pytest.approx(math.log(12), abs=1e-6)
    assert out.parts["divergence"].item() == pytest.approx(4.0150979, abs=1e-5)
    assert out.parts["complexity"].item() == pytest.approx(25.0)
    out.per_sample.sum().backward()
    assert logits.grad[0, 0, 1].abs().sum() == 0, "a PAD cell outside both grids must get no gradient"
    assert logits.grad[0, 0, 0].abs().sum() > 0


def test_mask_ratio_scales_loss_and_counts_wrong_cells():
    """Two valid cells, input == target = [1, 2]: cell 0 predicted right, cell 1 wrong. The wrong
    cell is hard (weight 2), the right one easy (input == target), mask_ratio = 1/2, so

        efe = (0.5 + 0.5 * 0.5) * (1 * cell_loss_0 + 2 * cell_loss_1) / 2

    and with every cell right: mask_ratio 0, no hard cell, efe = 0.5 * (cell_loss_0 + cell_loss_1) / 2."""
    cfg = LossCfg(lambda_c=0.0)
    logits = torch.zeros(1, 1, 2, C)
    logits[0, 0, 0, 1] = 5.0
    logits[0, 0, 1, 7] = 5.0
    target = torch.tensor([[[1, 2]]])
    out = efe_loss(logits, target, target.clone(), torch.zeros(1, 4), torch.zeros(1, 4), cfg=cfg)
    assert out.mask_ratio.item() == pytest.approx(0.5)  # 1 wrong of 2 valid
    cell = per_cell_loss(logits, target, cfg)
    assert out.per_sample.item() == pytest.approx(0.75 * (cell[0] + 2 * cell[1]) / 2, rel=1e-6)
    logits[0, 0, 1, 2] = 10.0  # now right as well
    right = efe_loss(logits, target, target.clone(), torch.zeros(1, 4), torch.zeros(1, 4), cfg=cfg)
    cell = per_cell_loss(logits, target, cfg)
    assert right.mask_ratio.item() == 0.0
    assert right.per_sample.item() == pytest.approx(0.5 * (cell[0] + cell[1]) / 2, rel=1e-6)


def per_cell_loss(logits, target, cfg):
    """risk + lambda_r * KL + lambda_a * H per cell of a [1, 1, W, C] canvas, written out in float64."""
    q = torch.softmax(logits[0, 0].double(), -1)
    out = []
    for w, t in enumerate(target[0, 0].tolist()):
        onehot = torch.nn.functional.one_hot(torch.tensor(t), C).double()
        pref = (1 - cfg.label_smoothing) * onehot + cfg.label_smoothing / C
        p_eps = (1 - cfg.kl_eps) * onehot + cfg.kl_eps / C
        risk = -(pref * q[w].log()).sum()
        kl = (q[w] * (q[w].log() - p_eps.log())).sum()
        entropy = -(q[w] * q[w].log()).sum()
        out.append(float(risk + cfg.lambda_r * kl + cfg.lambda_a * entropy))
    return out


def test_a_sample_weighs_the_same_whatever_its_grid_size():
    """loss_function.py: the per-sample loss is a mean over the sample's valid cells, so a grid and
    the same grid tiled 10x10 (100 times the cells, each predicted alike) have the same loss, and in
    a batch of both each sample's gradient has the same weight; a sum over cells would give the
    large one 100 times the small one's loss."""
    torch.manual_seed(0)
    small_logits, small_target = torch.randn(3, 3, C), torch.randint(0, 10, (3, 3))
    small_input = torch.randint(0, 10, (3, 3))
    tile = (10, 10, 1)
    logits = torch.full((2, 30, 30, C), -5.0)
    logits[..., PAD] = 5.0  # outside a grid: PAD, right and excluded
    target = torch.full((2, 30, 30), PAD)
    inp = torch.full((2, 30, 30), PAD)
    logits[0, :3, :3], target[0, :3, :3], inp[0, :3, :3] = small_logits, small_target, small_input
    logits[1], target[1], inp[1] = small_logits.repeat(*tile), small_target.repeat(10, 10), small_input.repeat(10, 10)
    logits.requires_grad_(True)
    out = efe_loss(logits, target, inp, torch.zeros(2, 4), torch.zeros(2, 4), cfg=LossCfg())
    assert out.per_sample[0].item() == pytest.approx(out.per_sample[1].item(), rel=1e-5)
    out.per_sample.sum().backward()
    small_grad, large_grad = logits.grad[0, :3, :3].abs().sum(), logits.grad[1].abs().sum()
    assert large_grad.item() == pytest.approx(small_grad.item(), rel=1e-4)  # the same total weight


def test_float_target_is_a_clear_error():
    logits, target, inp, refined, prompt = one_cell_case()
    with pytest.raises(TypeError, match="torch.long"):
        efe_loss(logits, target.float(), inp, refined, prompt)


def test_log_likelihood():
    """(The combined loss: test_training_loss_weights_the_two_refinements_and_signs_the_reward.)"""
    logits, target, inp, refined, prompt = one_cell_case()
    # Uniform q: log-likelihood of the one valid cell is log(1/12).
    assert efe_loss(logits, target, inp, refined, prompt).log_likelihood.item() == pytest.approx(-math.log(12))


def test_several_predictions_of_a_batch_in_one_pass_match_one_pass_each():
    """efe_loss over [K, B, ...] (training's two refinements) gives each prediction what a call of
    its own gives: the loss, its gradient, the mask ratio, the log-likelihood and the parts."""
    torch.manual_seed(0)
    k, b, s = 2, 3, 5
    logits = torch.randn(k, b, s, s, C, requires_grad=True)
    target, inp = torch.randint(0, 10, (b, s, s)), torch.randint(0, 10, (b, s, s))
    target[0, 3:], inp[0, 3:] = PAD, PAD  # a smaller grid in the first sample
    refined, prompt = torch.randn(k, b, 4, requires_grad=True), torch.randn(b, 4)
    together = efe_loss(logits, target, inp, refined, prompt)
    together.per_sample.sum().backward()
    grads = logits.grad.clone(), refined.grad.clone()
    logits.grad, refined.grad = None, None
    for i in range(k):
        alone = efe_loss(logits[i], target, inp, refined[i], prompt)
        alone.per_sample.sum().backward()
        torch.testing.assert_close(together.per_sample[i], alone.per_sample)
        torch.testing.assert_close(together.mask_ratio[i], alone.mask_ratio)
        torch.testing.assert_close(together.log_likelihood[i], alone.log_likelihood)
        for name, part in together.parts.items():
            torch.testing.assert_close(part[i], alone.parts[name])
    torch.testing.assert_close(grads[0], logits.grad)
    torch.testing.assert_close(grads[1], refined.grad)


def test_training_loss_weights_the_two_refinements_and_signs_the_reward():
    """Sampled logits uniform, mean logits confident on the target: the reward is 5 * (log(1/12) -
    log q_mean(target)) < 0, and the loss is 0.7 * EFE(sampled) + 0.3 * EFE(mean)."""
    logits, target, inp, refined, prompt = one_cell_case()
    confident = torch.zeros_like(logits)
    confident[..., 3] = 8.0
    both = torch.stack([logits, confident])  # [2, B, S, S, C]: sampled, then mean
    out = training_loss(both, torch.stack([refined, refined]), prompt, target, inp, cfg=LossCfg())
    sampled = efe_loss(logits, target, inp, refined, prompt).per_sample
    mean = efe_loss(confident, target, inp, refined, prompt).per_sample
    torch.testing.assert_close(out.per_sample, 0.7 * sampled + 0.3 * mean)
    log_q_mean = torch.log_softmax(confident[0, 0, 0], -1)[3]
    assert out.reward.item() == pytest.approx(5.0 * (-math.log(12) - log_q_mean.item()), rel=1e-5)
    assert out.reward.item() < 0
