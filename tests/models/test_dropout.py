"""`litmt.models.Dropout`: the CPU mask's drop rate, scaling, gradient and reproducibility."""

from __future__ import annotations

import pytest
import torch

from litmt.models.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_is_p_in_every_16_bit_lane(p):
    torch.manual_seed(0)
    mask = keep_mask(torch.Size([1 << 20]), p, torch.device("cpu"))
    dropped = (~mask).float()
    # 2^20 draws: the rate's standard deviation is < 5e-4; p is rounded to 2^-16 steps
    assert dropped.mean().item() == pytest.approx(p, abs=2.5e-3)
    for lane in range(4):  # each 64-bit draw gives four 16-bit uniforms: none is biased
        assert dropped[lane::4].mean().item() == pytest.approx(p, abs=5e-3)


def test_kept_values_are_scaled_and_gradient_uses_the_same_mask():
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    out = dropout(x, 0.25, training=True)
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] / 0.75)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(kept, upstream / 0.75, 0.0))


def test_same_seed_same_mask_other_seed_other_mask():
    x = torch.ones(1000)
    torch.manual_seed(3)
    a = dropout(x, 0.1, True)
    torch.manual_seed(3)
    b = dropout(x, 0.1, True)
    torch.manual_seed(4)
    c = dropout(x, 0.1, True)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_eval_mode_and_zero_p_are_the_identity():
    x = torch.randn(10, 10)
    layer = Dropout(0.3).eval()
    assert layer(x) is x
    assert dropout(x, 0.0, training=True) is x
    assert isinstance(Dropout(0.1), torch.nn.Dropout)
