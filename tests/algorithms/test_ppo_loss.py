"""Decoupled PPO actor loss and value loss vs hand-worked values."""

import math

import pytest
import torch

from embodied_async.algorithms import decoupled_ppo_actor_loss, masked_mean, value_loss


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


# the settings the hand-worked values below assume (the loss has no defaults of its own)
SETTINGS = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, behave_weight_threshold=None)
VALUE_SETTINGS = dict(value_clip=None, huber_delta=10.0)


def logp_for_ratios(ratios):
    """Current log-probs giving ratio r against proximal = behaviour = 0."""
    return torch.log(t(ratios)).requires_grad_(True)


def actor_loss(ratios, adv, **kw):
    logp = logp_for_ratios(ratios)
    zeros = torch.zeros(len(ratios))
    loss, metrics = decoupled_ppo_actor_loss(logp, zeros, zeros, t(adv), **{**SETTINGS, **kw})
    loss.backward()
    return loss, metrics, logp.grad


def test_unclipped_region():
    # r=1.1, A=2: pg1 = -2.2, pg2 = -2*1.1 = -2.2 -> -2.2
    # r=0.9, A=-1: pg1 = 0.9, pg2 = 0.9 -> 0.9 ; mean = -0.65
    # dL/dlogp_i = -A_i * r_i / N = [-1.1, 0.45]
    loss, m, grad = actor_loss([1.1, 0.9], [2.0, -1.0])
    assert loss.item() == pytest.approx(-0.65)
    assert m["train/actor/policy_loss"] == pytest.approx(-0.65)
    assert m["train/actor/clip_fraction"] == 0.0 and m["train/actor/dual_clip_fraction"] == 0.0
    assert m["train/actor/ratio_mean"] == pytest.approx(1.0)
    # reported as RLinf does, -mean ln r: -(0.0953102 - 0.1053605) / 2 = 0.0050252
    assert m["train/actor/proximal_approx_kl"] == pytest.approx(0.0050252, abs=1e-6)
    # target_kl's k3 = (r-1) - ln r: 0.1 - 0.0953102 = 0.0046898 ; -0.1 + 0.1053605 = 0.0053605
    assert m["train/actor/trust_region_kl"] == pytest.approx(0.0050252, abs=1e-6)
    assert m["train/actor/behav_approx_kl"] == pytest.approx(0.0)
    torch.testing.assert_close(grad, t([-1.1, 0.45]))


def test_clipping_high_and_low():
    # eps = 0.2, clip range [0.8, 1.2]
    # 0: r=1.5, A=1:  pg1=-1.5, pg2=-1.2 -> -1.2 (clip active, no grad)
    # 1: r=0.5, A=-1: pg1= 0.5, pg2= 0.8 ->  0.8 (clip active, no grad)
    # 2: r=0.5, A=2:  pg1=-1.0, pg2=-1.6 -> -1.0 (pessimistic unclipped term)
    # 3: r=1.5, A=-1: pg1= 1.5, pg2= 1.2 ->  1.5 (below dual bound 3)
    # mean = (-1.2 + 0.8 - 1.0 + 1.5) / 4 = 0.025
    # grads: 0, 0, -2*0.5/4 = -0.25, 1*1.5/4 = 0.375
    loss, m, grad = actor_loss([1.5, 0.5, 0.5, 1.5], [1.0, -1.0, 2.0, -1.0])
    assert loss.item() == pytest.approx(0.025)
    assert m["train/actor/clip_fraction"] == pytest.approx(0.5)
    assert m["train/actor/dual_clip_fraction"] == 0.0
    assert m["train/actor/ratio_mean"] == pytest.approx(1.0)
    torch.testing.assert_close(grad, t([0.0, 0.0, -0.25, 0.375]))


def test_asymmetric_clip_range():
    # low=0.1, high=0.3 -> [0.9, 1.3]. r=1.25, A=1 is inside -> -1.25 (unclipped).
    # r=0.85, A=-1 is below 0.9 -> pg2 = 0.9 > pg1 = 0.85 -> 0.9 ; mean = -0.175
    loss, m, _ = actor_loss([1.25, 0.85], [1.0, -1.0], clip_ratio_low=0.1, clip_ratio_high=0.3)
    assert loss.item() == pytest.approx(-0.175)
    assert m["train/actor/clip_fraction"] == pytest.approx(0.5)


def test_dual_clip():
    # c = 3. 0: r=5, A=-1: clipped = max(5, 1.2) = 5 > 3*|A| = 3 -> 3 (dual active, no grad)
    #        1: r=2.5, A=-1: clipped = 2.5 < 3 -> 2.5 (grad = 1*2.5/2 = 1.25)
    # mean = 2.75 ; without dual clip: (5 + 2.5) / 2 = 3.75
    loss, m, grad = actor_loss([5.0, 2.5], [-1.0, -1.0], clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(2.75)
    assert m["train/actor/dual_clip_fraction"] == pytest.approx(0.5)
    assert m["train/actor/clip_fraction"] == pytest.approx(0.0)  # pg2 < pg1 for both
    torch.testing.assert_close(grad, t([0.0, 1.25]))

    loss_nodual, m_nodual, _ = actor_loss([5.0, 2.5], [-1.0, -1.0], clip_ratio_c=None)
    assert loss_nodual.item() == pytest.approx(3.75)
    assert m_nodual["train/actor/dual_clip_fraction"] == 0.0


def test_dual_clip_ignores_positive_advantages():
    # r=5, A=+1: clipped = max(-5, -1.2) = -1.2; dual clip only applies to A<0.
    loss, m, _ = actor_loss([5.0], [1.0], clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(-1.2)
    assert m["train/actor/dual_clip_fraction"] == 0.0


def test_behaviour_weight_and_mask():
    # r = 1 everywhere (logp = proximal). w = pi_p / pi_b = [2, 0.5, 4], A = [1, 1, -2]
    # loss_i = -A = [-1, -1, 2] ; w * loss_i = [-2, -0.5, 8]
    # no threshold: 5.5 / 3 = 1.8333333
    # threshold 3: sample 2 masked, still counted in the denominator as training counts it
    # (the loss mask's decisions) -> (-2 - 0.5) / 3 = -0.8333333
    # grads (threshold 3): w * -A * r / 3 = [-2/3, -1/6, 0]
    # behav KL as RLinf reports it, -mean ln w: -(ln 2 - ln 2 + ln 4) / 3 = -0.4620981
    prox = torch.zeros(3, requires_grad=True)
    behav = (-torch.log(t([2.0, 0.5, 4.0]))).requires_grad_(True)
    adv = t([1.0, 1.0, -2.0])

    logp = torch.zeros(3, requires_grad=True)
    loss, m = decoupled_ppo_actor_loss(logp, prox, behav, adv, **SETTINGS)
    assert loss.item() == pytest.approx(5.5 / 3)
    assert m["train/actor/behav_clip_fraction"] == 0.0
    assert m["train/actor/behav_approx_kl"] == pytest.approx(-math.log(4) / 3, abs=1e-6)

    logp = torch.zeros(3, requires_grad=True)
    loss, m = decoupled_ppo_actor_loss(logp, prox, behav, adv, **{**SETTINGS, "behave_weight_threshold": 3.0})
    loss.backward()
    assert loss.item() == pytest.approx(-2.5 / 3)
    assert m["train/actor/behav_clip_fraction"] == pytest.approx(1 / 3)
    torch.testing.assert_close(logp.grad, t([-2 / 3, -1 / 6, 0.0]))
    # the same as training computes it: the loss mask's count passed as the normaliser
    logp = torch.zeros(3, requires_grad=True)
    trained, _ = decoupled_ppo_actor_loss(logp, prox, behav, adv, loss_normalizer=3.0,
                                          **{**SETTINGS, "behave_weight_threshold": 3.0})
    assert trained.item() == pytest.approx(loss.item())
    # Gradient flows only through the current log-probs.
    assert prox.grad is None and behav.grad is None


def test_loss_mask_and_normalizer():
    # Same first two samples as test_unclipped_region; the third (r=100) is masked out.
    ratios, adv = [1.1, 0.9, 100.0], [2.0, -1.0, 5.0]
    mask = torch.tensor([True, True, False])
    loss, m, grad = actor_loss(ratios, adv, loss_mask=mask)
    assert loss.item() == pytest.approx(-0.65)
    assert m["train/actor/ratio_mean"] == pytest.approx(1.0)  # over masked entries only
    torch.testing.assert_close(grad, t([-1.1, 0.45, 0.0]))

    # Global normaliser 4 (e.g. two ranks with 2 valid samples each): -1.3 / 4
    loss, _, grad = actor_loss(ratios, adv, loss_mask=mask, loss_normalizer=4.0)
    assert loss.item() == pytest.approx(-0.325)
    torch.testing.assert_close(grad, t([-0.55, 0.225, 0.0]))
    loss, _, _ = actor_loss(ratios, adv, loss_mask=mask, loss_normalizer=torch.tensor(4.0))
    assert loss.item() == pytest.approx(-0.325)


def test_all_masked_gives_zero_loss():
    loss, m, _ = actor_loss([1.5], [1.0], loss_mask=torch.tensor([False]))
    assert loss.item() == 0.0 and not math.isnan(m["train/actor/clip_fraction"])


def test_masked_mean():
    x = t([1.0, 2.0, 3.0, 4.0])
    assert masked_mean(x).item() == pytest.approx(2.5)
    assert masked_mean(x, torch.tensor([True, False, True, False])).item() == pytest.approx(2.0)
    assert masked_mean(x, torch.tensor([True, False, True, False]), 8.0).item() == pytest.approx(0.5)


def test_value_loss_huber_branches():
    # returns [2, 0], values [1, 3]
    # delta=1: e=-1 -> 0.5*1 = 0.5 (quadratic) ; e=3 -> 1*(3 - 0.5) = 2.5 (linear) ; mean 1.5
    # grads: quadratic (v-R)/N = -0.5 ; linear delta*sign(e)/N = 0.5
    values = t([1.0, 3.0], requires_grad=True)
    loss, m = value_loss(values, t([0.0, 0.0]), t([2.0, 0.0]), value_clip=None, huber_delta=1.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.5)
    assert m["train/critic/value_loss"] == pytest.approx(1.5)
    assert m["train/critic/value_clip_fraction"] == 0.0
    torch.testing.assert_close(values.grad, t([-0.5, 0.5]))

    # delta=10: both quadratic -> (0.5 + 4.5) / 2 = 2.5
    loss, _ = value_loss(t([1.0, 3.0]), t([0.0, 0.0]), t([2.0, 0.0]), **VALUE_SETTINGS)
    assert loss.item() == pytest.approx(2.5)


def test_value_loss_clipped():
    # old [0, 0], values [1, 3], returns [2, 0], clip 0.5 -> clipped preds [0.5, 0.5]
    # 0: unclipped 0.5*1^2 = 0.5, clipped 0.5*1.5^2 = 1.125 -> 1.125 (clip wins, no grad)
    # 1: unclipped 0.5*3^2 = 4.5, clipped 0.5*0.5^2 = 0.125 -> 4.5 (grad 3/2 = 1.5)
    # mean = 2.8125, clip fraction 0.5
    values = t([1.0, 3.0], requires_grad=True)
    old = t([0.0, 0.0], requires_grad=True)
    loss, m = value_loss(values, old, t([2.0, 0.0]), **{**VALUE_SETTINGS, "value_clip": 0.5})
    loss.backward()
    assert loss.item() == pytest.approx(2.8125)
    assert m["train/critic/value_clip_fraction"] == pytest.approx(0.5)
    torch.testing.assert_close(values.grad, t([0.0, 1.5]))
    assert old.grad is None


def test_value_loss_mask():
    # Only sample 1 counts: 0.5*3^2 = 4.5 ; with normaliser 3: 1.5
    mask = torch.tensor([False, True])
    loss, _ = value_loss(t([1.0, 3.0]), t([0.0, 0.0]), t([2.0, 0.0]), loss_mask=mask, **VALUE_SETTINGS)
    assert loss.item() == pytest.approx(4.5)
    loss, _ = value_loss(
        t([1.0, 3.0]), t([0.0, 0.0]), t([2.0, 0.0]), loss_mask=mask, loss_normalizer=3.0, **VALUE_SETTINGS
    )
    assert loss.item() == pytest.approx(1.5)
