"""EFE loss against numbers worked by hand."""

import math

import pytest
import torch

from data.canvas import PAD
from loss_function import EFECoefs, combined_loss, efe_loss, target_log_likelihood

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
    out = efe_loss(logits, target, inp, refined, prompt, EFECoefs())
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
    # Two valid cells (targets 1 and 2, input 1 and 2): cell 0 predicted right, cell 1 wrong.
    logits = torch.zeros(1, 1, 2, C)
    logits[0, 0, 0, 1] = 5.0
    logits[0, 0, 1, 7] = 5.0
    target = torch.tensor([[[1, 2]]])
    out = efe_loss(logits, target, target.clone(), torch.zeros(1, 4), torch.zeros(1, 4))
    assert out.mask_ratio.item() == pytest.approx(0.5)  # 1 wrong of 2 valid
    # With every cell right the factor is 0.5 and no cell is hard (input == target).
    logits[0, 0, 1, 2] = 10.0
    right = efe_loss(logits, target, target.clone(), torch.zeros(1, 4), torch.zeros(1, 4))
    assert right.mask_ratio.item() == 0.0


def test_float_target_is_a_clear_error():
    logits, target, inp, refined, prompt = one_cell_case()
    with pytest.raises(TypeError, match="torch.long"):
        efe_loss(logits, target.float(), inp, refined, prompt)


def test_target_log_likelihood_and_combined_loss():
    logits, target, inp, _, _ = one_cell_case()
    # Uniform q: log-likelihood of the one valid cell is log(1/12).
    assert target_log_likelihood(logits, target, inp).item() == pytest.approx(-math.log(12))
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])
    # 0.7 * [1, 2] + 0.3 * [3, 5] = [1.6, 2.9]
    assert torch.allclose(combined_loss(a, b, 0.7, 0.3), torch.tensor([1.6, 2.9]))
