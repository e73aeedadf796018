"""Proximal log-prob interpolation and staleness filtering."""

import pytest
import torch

from embodied_async.algorithms import (
    interpolate_proximal_logprobs,
    is_fresh,
    staleness,
)


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


def test_interpolation_by_version():
    # Actor at V=5 trains toward 6: proximal_version=5, current_version=6.
    # v_b=5: alpha = 0/1 = 0    -> -1
    # v_b=4: alpha = 1/2        -> -1 + 0.5*(-3 - -1) = -2
    # v_b=3: alpha = 2/3        -> -1 + (2/3)*(-2)    = -2.3333333
    # v_b=6: denominator 0 -> alpha 0 -> behaviour -2 (ignores current -7)
    behav = t([-1.0, -1.0, -1.0, -2.0])
    current = t([-3.0, -3.0, -3.0, -7.0], requires_grad=True)
    versions = torch.tensor([5, 4, 3, 6])
    out = interpolate_proximal_logprobs(behav, current, versions, 5, 6)
    torch.testing.assert_close(out, t([-1.0, -2.0, -2.3333333, -2.0]))
    assert not out.requires_grad


def test_interpolation_alpha_clamped_to_one():
    # proximal_version == current_version = 6, v_b = 4: alpha = 2/2 = 1 -> current
    # v_b = 2 with proximal 7, current 6: (7-2)/(6-2) = 1.25 -> clamped to 1
    out = interpolate_proximal_logprobs(t([-1.0]), t([-4.0]), torch.tensor([4]), 6, 6)
    torch.testing.assert_close(out, t([-4.0]))
    out = interpolate_proximal_logprobs(t([-1.0]), t([-4.0]), torch.tensor([2]), 7, 6)
    torch.testing.assert_close(out, t([-4.0]))


def test_staleness_and_is_fresh():
    versions = torch.tensor([[3, 4], [4, 5]])
    assert staleness(versions, 6) == 3
    assert isinstance(staleness(versions, 6), int)
    assert is_fresh(versions, 6, threshold=3)
    assert not is_fresh(versions, 6, threshold=2)
