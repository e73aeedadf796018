"""How one update weighs what it averages: micro-batch metrics by their trained decisions, the
entropy bonus at the policy term's scale under token-level log-probs, and the value clip anchored
on the proximal pass's values."""

import pytest
import torch
from test_ppo_guards import N, TinyPolicy, batch, settings
from test_token_level_ratio import PerDimensionPolicy

from embodied_async.algorithms import ppo
from embodied_async.algorithms.ppo import ppo_update


def one_pass(policy, data, **overrides):
    """One epoch, one minibatch of the whole batch in micro-batches of 8, no step that changes
    what the metrics saw (they are computed before it)."""
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    s = settings(epochs=1, minibatch_size=N, micro_batch_size=8, normalize_advantages=False, **overrides)
    return ppo_update(policy, optimizer, data, s, lambda t: t, torch.Generator().manual_seed(0))


def test_metrics_weigh_each_micro_batch_by_its_trained_decisions():
    policy = TinyPolicy()
    policy.body[1].p = 0.0  # no dropout: the anchor and the trained pass agree (ratio 1)
    data = batch()
    data.loss_mask = torch.zeros(N, dtype=torch.bool)
    data.loss_mask[torch.randperm(N, generator=torch.Generator().manual_seed(3))[:11]] = True
    with torch.no_grad():
        proximal = policy.evaluate(data.forward_inputs, data.actions)[0]
    weight = torch.exp(proximal - data.behaviour_logprobs)
    expected = float((weight * -data.advantages)[data.loss_mask].mean())  # ratio 1: w * -A per decision
    metrics = one_pass(policy, data)
    assert abs(metrics["train/actor/policy_loss"] - expected) < 1e-4 * max(1.0, abs(expected))


def entropy_gradient(logprob_type: str) -> torch.Tensor:
    policy = PerDimensionPolicy()
    if logprob_type == "chunk_level":
        evaluate = policy.evaluate
        policy.evaluate = lambda inputs, actions: (evaluate(inputs, actions)[0].sum(1), *evaluate(inputs, actions)[1:])
    data = batch()
    data.advantages = torch.zeros(N)  # the policy term pulls nowhere: the bonus alone moves the std
    with torch.no_grad():
        data.behaviour_logprobs = policy.evaluate(data.forward_inputs, data.actions)[0]
    grads = []
    original = ppo.clip_gradients
    ppo.clip_gradients = lambda p, max_norm: (grads.append(p.head.log_std.grad.clone()), original(p, 1e9))[1]
    try:
        one_pass(policy, data, entropy_coef=0.1, train_critic=False, logprob_type=logprob_type)
    finally:
        ppo.clip_gradients = original
    return grads[0]


def test_the_entropy_bonus_keeps_the_policy_terms_scale_under_token_level_log_probs():
    """token_level's policy term is a mean over a decision's K = 2 entries, chunk_level's a sum (at
    r = 1 their gradients differ by K): the entropy bonus follows, so their balance is the same."""
    chunk, token = entropy_gradient("chunk_level"), entropy_gradient("token_level")
    assert float(chunk.abs().min()) > 0
    torch.testing.assert_close(token * 2, chunk, atol=1e-6, rtol=1e-5)


def test_the_value_clip_is_anchored_on_the_proximal_passs_values():
    """With rollout.recompute_logprobs the values of the same pass (the policy before this update)
    anchor the clip, not the rollout's several versions old."""
    policy = TinyPolicy()
    data = batch()
    rollout_values = data.old_values.clone()
    anchors = []
    original = ppo.value_loss
    ppo.value_loss = lambda values, old_values, *args, **kwargs: (anchors.append(old_values.clone()),
                                                                   original(values, old_values, *args, **kwargs))[1]
    try:
        one_pass(policy, data, value_clip=0.2)
    finally:
        ppo.value_loss = original
    with torch.no_grad():
        policy.eval()
        proximal_values = policy.evaluate(data.forward_inputs, data.actions)[2]
    seen = torch.cat(anchors)
    assert sorted(seen.tolist()) == sorted(proximal_values.tolist())
    assert not torch.allclose(torch.sort(seen).values, torch.sort(rollout_values).values)


class ChunkPolicy(torch.nn.Module):
    """A Gaussian policy over chunks of 2 actions x 2 dimensions, reporting one log-prob per entry
    (action-major); ``first_only`` reports the first action's entries alone."""

    def __init__(self, first_only: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.log_std, self.first_only = torch.nn.Linear(3, 4), torch.nn.Parameter(torch.zeros(4)), first_only

    def evaluate(self, forward_inputs, actions):
        dist = torch.distributions.Normal(self.body(forward_inputs["states"]), self.log_std.exp())
        entries = dist.log_prob(actions.reshape(len(actions), 4))
        return (entries[:, :2] if self.first_only else entries), torch.zeros(len(actions)), torch.zeros(len(actions))


def first_gradient(policy, data, **overrides):
    grads, original = [], ppo.clip_gradients
    ppo.clip_gradients = lambda p, max_norm: (grads.append([q.grad.clone() for q in p.parameters()]),
                                              original(p, 1e9))[1]
    try:
        one_pass(policy, data, train_critic=False, action_chunk=2, **overrides)
    finally:
        ppo.clip_gradients = original
    return grads[0]


def chunk_batch(executed):
    data = batch()
    data.actions = torch.randn(N, 2, 2, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        data.behaviour_logprobs = ChunkPolicy().evaluate(data.forward_inputs, data.actions)[0] - 0.05
    data.executed_actions = executed
    return data


def test_actions_a_chunk_never_executed_stay_out_of_the_decisions_log_prob():
    """An episode that ended after the first action of every chunk: the update is the one of a
    policy whose log-prob covers that action alone, summed into the decision (chunk_level) or per
    entry (token_level, whose denominator still counts all 4 entries of a decision)."""
    ran_one = torch.ones(N, dtype=torch.int64)
    first = chunk_batch(None)
    first.behaviour_logprobs = first.behaviour_logprobs[:, :2]
    for logprob_type, scale in (("chunk_level", 1.0), ("token_level", 2.0)):
        masked = first_gradient(ChunkPolicy(), chunk_batch(ran_one), logprob_type=logprob_type)
        alone = first_gradient(ChunkPolicy(first_only=True), first, logprob_type=logprob_type)
        for got, expected in zip(masked, alone):
            torch.testing.assert_close(got * scale, expected, atol=1e-6, rtol=1e-5)
    # every action ran: the second action's entries count again
    whole = first_gradient(ChunkPolicy(), chunk_batch(torch.full((N,), 2)), logprob_type="chunk_level")
    assert not torch.allclose(whole[0], first_gradient(ChunkPolicy(first_only=True), first)[0])


def test_the_anchor_pulls_toward_the_warm_start_and_is_logged():
    """algorithm.anchor_kl_coef: with zero advantages the only pull on the policy is the KL toward
    the warm start's weights (swapped in for one pass), so an update moves a drifted policy back
    toward it; the anchor's KL is logged, and nothing moves without the warm start."""
    policy = TinyPolicy()
    policy.body[1].p = 0.0
    warm = {name: p.detach().clone() for name, p in policy.named_parameters()}
    with torch.no_grad():
        policy.body[2].bias.add_(0.5)  # drifted away from the warm start

    def distance():
        return float((policy.body[2].bias - warm["body.2.bias"]).abs().sum())

    data = batch()
    data.advantages = torch.zeros(N)
    before = distance()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.05)
    s = settings(epochs=4, normalize_advantages=False, train_critic=False, anchor_kl_coef=1.0)
    metrics = ppo_update(policy, optimizer, data, s, lambda t: t, torch.Generator().manual_seed(0),
                         warm_start=warm)
    assert metrics["train/actor/anchor_kl"] > 0.01 and distance() < 0.9 * before
    # without the anchor the zero advantages pull nowhere
    moved = distance()
    ppo_update(policy, optimizer, data, settings(epochs=4, normalize_advantages=False, train_critic=False),
               lambda t: t, torch.Generator().manual_seed(0))
    assert abs(distance() - moved) < 1e-6
    with pytest.raises(ValueError, match="anchor_kl_coef > 0 needs the warm start"):
        ppo_update(policy, optimizer, batch(), s, lambda t: t, torch.Generator().manual_seed(0))
