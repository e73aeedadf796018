"""algorithm.logprob_type=token_level: one PPO ratio per action dimension, against hand-worked
values, and the update end to end on per-dimension log-probs."""

import math

import torch
from test_ppo_guards import N, batch, settings

from embodied_async.algorithms.ppo import ppo_update
from embodied_async.algorithms.ppo_loss import decoupled_ppo_actor_loss
from embodied_async.algorithms.proximal import interpolate_proximal_logprobs
from models.common import GaussianHead

# the PPO clip alone (clip 0.2, no dual clip, no behaviour-weight mask)
CLIP_ONLY = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None, behave_weight_threshold=None)


def test_each_dimension_is_clipped_on_its_own_and_the_loss_is_their_mean():
    # one decision, advantage +1, two dimensions whose ratios moved to 1.5 and 1.0 (clip 0.2)
    current = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    anchor = torch.zeros(1, 2)
    loss, metrics = decoupled_ppo_actor_loss(current, anchor, anchor, torch.tensor([1.0]), **CLIP_ONLY)
    assert math.isclose(float(loss), -(1.2 + 1.0) / 2, rel_tol=1e-6)
    assert metrics["train/actor/clip_fraction"] == 0.5
    loss.backward()
    # the clipped dimension gets no gradient, the other its own (d/dlog r of -r/2 at r = 1)
    torch.testing.assert_close(current.grad, torch.tensor([[0.0, -0.5]]))
    # one ratio for the decision (their product, 1.5) is clipped whole: no gradient at all
    summed = current.detach().sum(1).requires_grad_()
    chunk_loss, _ = decoupled_ppo_actor_loss(summed, anchor.sum(1), anchor.sum(1), torch.tensor([1.0]), **CLIP_ONLY)
    chunk_loss.backward()
    assert math.isclose(float(chunk_loss), -1.2, rel_tol=1e-6) and float(summed.grad) == 0.0


def test_masks_advantages_and_normalisers_act_per_decision_and_the_kl_stays_per_decision():
    current = torch.tensor([[0.1, -0.1, 0.2], [0.3, 0.0, 0.0], [5.0, 5.0, 5.0]])
    behaviour = torch.zeros(3, 3)
    advantages = torch.tensor([1.0, -2.0, 100.0])
    mask = torch.tensor([True, True, False])  # the third decision never counts
    loss, metrics = decoupled_ppo_actor_loss(current, behaviour, behaviour, advantages, mask, clip_ratio_low=0.2,
                                             clip_ratio_high=0.28, clip_ratio_c=None, behave_weight_threshold=None,
                                             loss_normalizer=4.0)
    ratio = current[:2].exp()
    per_element = torch.max(-advantages[:2, None] * ratio,
                            -advantages[:2, None] * ratio.clamp(0.8, 1.28))
    assert math.isclose(float(loss), float(per_element.sum() / (4.0 * 3)), rel_tol=1e-6)
    # the KL of a decision sums its dimensions', so target_kl keeps its meaning (k3 estimator); the
    # reported one is RLinf's -mean log r
    k3 = (ratio - 1) - current[:2]
    assert math.isclose(metrics["train/actor/trust_region_kl"], float(k3.sum(1).mean()), rel_tol=1e-6)
    assert math.isclose(metrics["train/actor/proximal_approx_kl"], float(-current[:2].sum(1).mean()), rel_tol=1e-6)


def test_one_dimension_is_the_chunk_level_loss():
    g = torch.Generator().manual_seed(0)
    current, anchor, behaviour = (torch.randn(16, generator=g) * 0.3 for _ in range(3))
    advantages, mask = torch.randn(16, generator=g), torch.rand(16, generator=g) > 0.2
    kwargs = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, behave_weight_threshold=1.5)
    chunk, chunk_metrics = decoupled_ppo_actor_loss(current, anchor, behaviour, advantages, mask, **kwargs)
    token, token_metrics = decoupled_ppo_actor_loss(current[:, None], anchor[:, None], behaviour[:, None],
                                                    advantages, mask, **kwargs)
    assert math.isclose(float(chunk), float(token), rel_tol=1e-6)
    for name, value in chunk_metrics.items():
        assert math.isclose(value, token_metrics[name], rel_tol=1e-6, abs_tol=1e-9), name


def test_proximal_interpolation_broadcasts_one_version_per_decision():
    behaviour = torch.zeros(2, 3)
    current = torch.ones(2, 3)
    proximal = interpolate_proximal_logprobs(behaviour, current, torch.tensor([4, 3]), 4, 5)
    torch.testing.assert_close(proximal, torch.tensor([[0.0] * 3, [0.5] * 3]))


class PerDimensionPolicy(torch.nn.Module):
    """A Gaussian policy reporting one log-prob per action dimension."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(3, 2)
        self.critic = torch.nn.Linear(3, 1)
        self.head = GaussianHead(1, 2, -0.5)

    def evaluate(self, forward_inputs, actions):
        mean = self.body(forward_inputs["states"])
        dist = torch.distributions.Normal(mean, self.head.log_std.exp())
        return dist.log_prob(actions[:, 0]), dist.entropy().sum(-1), self.critic(forward_inputs["states"]).squeeze(-1)


def test_an_update_on_per_dimension_log_probs_raises_their_advantage_weighted_likelihood():
    policy = PerDimensionPolicy()
    data = batch()
    with torch.no_grad():
        data.behaviour_logprobs = policy.evaluate(data.forward_inputs, data.actions)[0]
    assert data.behaviour_logprobs.shape == (N, 2)
    advantages = data.advantages.clone()

    def weighted_likelihood():
        with torch.no_grad():
            return float((policy.evaluate(data.forward_inputs, data.actions)[0].sum(1) * advantages).mean())

    before = weighted_likelihood()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    metrics = ppo_update(policy, optimizer, data, settings(normalize_advantages=False), lambda t: t,
                         torch.Generator().manual_seed(0))
    assert metrics["train/actor/optimizer_steps"] == 8 and metrics["train/actor/nonfinite_skipped"] == 0
    assert weighted_likelihood() > before
