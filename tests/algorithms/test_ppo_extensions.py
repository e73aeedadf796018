"""The update's extensions: demonstrations in the loss (a supervised term per policy step), a
value-free update (algorithm.adv_type=grpo trains no critic) and an empty batch."""

import numpy as np
import pytest
import torch
from test_ppo_guards import N, TinyPolicy, batch, settings

from embodied_async.algorithms.ppo import PPOBatch, ppo_update
from embodied_async.contracts import EnvSpec
from models.mlp.configuration_mlp import MLPConfig
from models.mlp.modeling_mlp import MLPPolicy


def mlp_policy():
    torch.manual_seed(0)
    spec = EnvSpec(obs_shapes={"states": (3,)}, obs_dtypes={"states": "float32"}, action_dim=2)
    return MLPPolicy(MLPConfig(hidden_sizes=[16], normalize_obs=False), spec)


def optimizer_for(policy):
    policy_params = [p for n, p in policy.named_parameters() if not n.startswith("critic.")]
    groups = [{"params": policy_params, "name": "policy"}]
    critic = [p for n, p in policy.named_parameters() if n.startswith("critic.")]
    if critic:
        groups.append({"params": critic, "name": "value"})
    return torch.optim.Adam(groups, lr=1e-2)


def zero_advantage_batch():
    data = batch()
    data.advantages = torch.zeros_like(data.advantages)  # the PPO term pulls nowhere
    return data


def demo_term(policy, calls):
    """A fixed batch of demonstrations: the expert's action is a function of the state."""
    rng = np.random.default_rng(0)
    states = rng.normal(size=(16, 3)).astype(np.float32)
    obs = {"states": states}
    actions = torch.as_tensor(np.tanh(states[:, :2]))[:, None]
    pad = torch.zeros(16, 1, dtype=torch.bool)

    def backward(scale):
        losses, _ = policy.supervised_loss(obs, actions, pad)
        (scale * losses.mean()).backward()
        calls.append(scale)
        return {"train/demo/loss": float(losses.detach().mean())}
    return backward


def test_the_demonstrations_term_falls_on_a_fixed_batch_and_is_logged_beside_ppos():
    policy, calls = mlp_policy(), []
    optimizer, term = optimizer_for(policy), demo_term(policy, calls)
    s = settings(epochs=1, minibatch_size=16, micro_batch_size=16, normalize_advantages=False, demo_loss_coef=0.5)
    losses = []
    for _ in range(15):
        metrics = ppo_update(policy, optimizer, zero_advantage_batch(), s, lambda t: t,
                             torch.Generator().manual_seed(0), demo_backward=term)
        losses.append(metrics["train/demo/loss"])
        assert "train/actor/policy_loss" in metrics
    assert calls == [0.5] * 30  # once per policy step (2 minibatches), weighted by the coefficient
    assert losses[-1] < losses[0] - 0.5


def test_no_demonstrations_term_while_the_critic_warms_up_or_with_a_zero_coefficient():
    policy, calls = mlp_policy(), []
    optimizer, term = optimizer_for(policy), demo_term(policy, calls)
    ppo_update(policy, optimizer, zero_advantage_batch(), settings(critic_warmup_left=100, demo_loss_coef=0.5),
               lambda t: t, torch.Generator().manual_seed(0), demo_backward=term)
    ppo_update(policy, optimizer, zero_advantage_batch(), settings(demo_loss_coef=0.0), lambda t: t,
               torch.Generator().manual_seed(0), demo_backward=term)
    assert calls == []


def test_a_value_free_update_trains_no_critic_and_reports_no_value_loss():
    policy = TinyPolicy()
    critic_before = [p.detach().clone() for p in policy.critic.parameters()]
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    policy.train()
    metrics = ppo_update(policy, optimizer, batch(), settings(train_critic=False), lambda t: t,
                         torch.Generator().manual_seed(0))
    assert not any(name.startswith("train/critic/") for name in metrics)
    assert all(torch.equal(a, b) for a, b in zip(critic_before, policy.critic.parameters()))
    assert metrics["train/actor/optimizer_steps"] == 8.0


def test_an_empty_batch_takes_no_step():
    policy = TinyPolicy()
    data = batch().rows(torch.zeros(0, dtype=torch.long))
    assert isinstance(data, PPOBatch) and len(data) == 0
    metrics = ppo_update(policy, torch.optim.Adam(policy.parameters()), data, settings(train_critic=False),
                         lambda t: t, torch.Generator().manual_seed(0))
    assert metrics["train/actor/optimizer_steps"] == 0.0 and np.isnan(metrics["train/actor/policy_loss"])


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_update_settings_take_the_new_keys_from_the_config(make_config, coef, tmp_path):
    from embodied_async.algorithms.ppo import UpdateSettings

    cfg = make_config("algorithm.adv_type=grpo", "algorithm.group_size=2", "algorithm.normalize_advantages=false",
                      f"algorithm.demo_loss_coef={coef}",
                      f"dataset.root={tmp_path}", "rollout.num_steps=12")
    s = UpdateSettings.from_config(cfg, world_size=1)
    assert s.train_critic is False and s.demo_loss_coef == coef
    assert cfg.model.add_value_head is False  # resolved from the algorithm: no critic is built


def test_fresh_samples_can_keep_their_behaviour_log_probs_as_the_proximal_ones():
    from embodied_async.algorithms.ppo import recompute_logprobs

    policy, data = TinyPolicy(), batch()
    data.versions = torch.tensor([4] * 20 + [5] * 12)  # 20 samples one version old, 12 of the current one
    seen = []
    evaluate = policy.evaluate
    policy.evaluate = lambda inputs, actions: seen.append(len(actions)) or evaluate(inputs, actions)
    every, every_values = recompute_logprobs(policy, data, 8, "cpu")
    assert sum(seen) == 32
    seen.clear()
    partial, partial_values = recompute_logprobs(policy, data, 8, "cpu", fresh_version=5)
    assert sum(seen) == 20  # only the stale ones went through the policy
    assert torch.equal(partial[:20], every[:20]) and torch.equal(partial[20:], data.behaviour_logprobs[20:])
    # the values of the same pass anchor the value clip; the fresh ones keep the rollout's
    assert torch.equal(partial_values[:20], every_values[:20]) and torch.equal(partial_values[20:],
                                                                              data.old_values[20:])
    assert not torch.equal(every_values[:20], data.old_values[:20])


def test_the_trained_rows_go_first_and_every_rank_keeps_as_many_as_the_fullest():
    """Two actor ranks: rank 0 has 5 trained rows, rank 1 has 9; both keep 9 (rank 0 pads with masked
    rows), so they take the same number of optimiser steps."""
    import types

    from embodied_async.workers.actor_worker import ActorWorker

    def shard(trained):
        data = batch()
        data.loss_mask = torch.zeros(N, dtype=torch.bool)
        data.loss_mask[torch.tensor(trained)] = True
        return data

    counts_seen = {0: 5.0, 1: 9.0}
    all_reduce = lambda t: torch.tensor([counts_seen[0], counts_seen[1]])  # noqa: E731  the sum over both ranks
    for rank, trained in ((0, [3, 7, 11, 20, 31]), (1, [0, 1, 2, 4, 8, 16, 17, 18, 30])):
        worker = types.SimpleNamespace(rank=rank, world_size=2, _all_reduce_sum=all_reduce)
        data = shard(trained)
        kept = ActorWorker._trained_rows(worker, data)
        assert len(kept) == 9 and int(kept.loss_mask.sum()) == len(trained)
        assert kept.loss_mask[:len(trained)].all()  # the trained rows first, in order
        assert torch.equal(kept.forward_inputs["states"][:len(trained)], data.forward_inputs["states"][trained])


def test_frozen_parameter_prefixes_take_no_step_and_must_name_parameters():
    """actor.frozen_parameter_prefixes: those parameters keep their values through an update (and
    through the demonstrations' term), the rest train; a prefix that names nothing is refused."""
    from embodied_async.workers.trainer_core import check_frozen_prefixes

    policy = TinyPolicy()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2, weight_decay=0.1)
    policy.train()
    ppo_update(policy, optimizer, batch(), settings(frozen_prefixes=("body.0.",)), lambda t: t,
               torch.Generator().manual_seed(0))
    for name, param in policy.named_parameters():
        moved = not torch.equal(param, before[name])
        assert moved == (not name.startswith("body.0.")), name
    names = {n for n, _ in policy.named_parameters()}
    check_frozen_prefixes(["body.0."], names)
    with pytest.raises(ValueError, match="'vision.' names no trainable parameter.*start with: body"):
        check_frozen_prefixes(["vision."], names)
