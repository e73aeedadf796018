"""Proximal log-prob interpolation and the version gate."""

import torch

from embodied_async.algorithms import VersionGate, interpolate_proximal_logprobs, staleness


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


def test_staleness_and_the_version_gate():
    versions = torch.tensor([[3, 4], [4, 5]])
    assert staleness(versions, 6) == 3
    assert isinstance(staleness(versions, 6), int)
    gate = VersionGate(size_per_stream=2, staleness_threshold=1, on_policy_min_ratio=0.5)
    assert gate.accepts(6, 5) and gate.accepts(6, 6) and not gate.accepts(6, 4)
    assert gate.capacity == 4  # two updates' worth may be unacknowledged
    assert gate.may_start(started=7, acknowledged=4) and not gate.may_start(started=8, acknowledged=4)
    assert gate.fresh_needed == 1  # 0.5 x 2, not 2 after float error
    assert VersionGate(3, 0, 1.0).fresh_needed == 3 and VersionGate(3, 0, 0.0).capacity == 3
