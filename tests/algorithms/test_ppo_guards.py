"""Numerical guards of the update: eval-mode proximal recompute, skipped non-finite steps, the
clamped log std, and the rollout's refusal of non-finite policy outputs."""

import types

import pytest
import torch
from torch import nn

from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update
from models.common import LOG_STD_MAX, LOG_STD_MIN, GaussianHead

N, DIM = 32, 3


class TinyPolicy(nn.Module):
    """Gaussian policy with dropout; ``poison_rows`` makes evaluate return NaN values there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(DIM, 16), nn.Dropout(0.5), nn.Linear(16, 2))
        self.critic = nn.Linear(DIM, 1)
        self.head = GaussianHead(1, 2, -0.5)
        self.modes_seen = []
        self.poison = None  # row marker: states[:, 0] == this value gives a NaN value

    def evaluate(self, forward_inputs, actions):
        self.modes_seen.append(self.training)
        states = forward_inputs["states"]
        logprobs, entropy = self.head.log_prob_entropy(self.body(states), actions)
        values = self.critic(states).squeeze(-1)
        if self.poison is not None:
            values = torch.where(states[:, 0] == self.poison, torch.full_like(values, float("nan")), values)
        return logprobs, entropy, values


def batch(poison_value=None):
    g = torch.Generator().manual_seed(1)
    states = torch.randn(N, DIM, generator=g)
    if poison_value is not None:
        states[0, 0] = poison_value
    return PPOBatch({"states": states}, torch.randn(N, 1, 2, generator=g), torch.randn(N, generator=g) - 2,
                    torch.randn(N, generator=g), torch.randn(N, generator=g), torch.randn(N, generator=g),
                    torch.zeros(N, dtype=torch.int64), torch.ones(N, dtype=torch.bool))


def settings(**overrides):
    values = dict(epochs=2, minibatch_size=8, micro_batch_size=8, world_size=1, version=0, recompute_logprobs=True,
                  critic_warmup_left=0, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                  behave_weight_threshold=None, value_clip=None, huber_delta=10.0, value_loss_coef=0.5,
                  entropy_coef=0.0, normalize_advantages=True, target_kl=None, max_grad_norm=0.5,
                  recompute_fresh_logprobs=True, policy_lr=0.0, policy_lr_warmup_steps=0, policy_steps_before=0,
                  policy_lr_factor=1.0, train_critic=True, demo_loss_coef=0.0, frozen_prefixes=())
    values.update(overrides)
    return UpdateSettings(**values)


def run_update(policy, data, **overrides):
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    policy.train()
    return ppo_update(policy, optimizer, data, settings(**overrides), lambda t: t, torch.Generator().manual_seed(0))


def test_proximal_recompute_runs_in_eval_mode_and_training_in_train_mode():
    policy = TinyPolicy()
    run_update(policy, batch())
    recompute_calls = N // 8
    assert policy.modes_seen[:recompute_calls] == [False] * recompute_calls  # no dropout in the anchor
    assert all(policy.modes_seen[recompute_calls:])
    assert policy.training  # left as it was


def test_nonfinite_step_is_skipped_and_counted():
    policy = TinyPolicy()
    policy.poison = 123.0
    metrics = run_update(policy, batch(poison_value=123.0))
    # the poisoned row lands in exactly one minibatch per epoch: 2 skipped steps out of 8
    assert metrics["train/actor/nonfinite_skipped"] == 2.0
    for param in policy.parameters():
        assert torch.isfinite(param).all()
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items())
    clean = run_update(TinyPolicy(), batch())
    assert clean["train/actor/nonfinite_skipped"] == 0.0
    # every step poisoned: nothing moves, and the update still reports
    policy, data = TinyPolicy(), batch()
    data.forward_inputs["states"][:, 0] = policy.poison = 7.0
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = run_update(policy, data)
    assert metrics["train/actor/nonfinite_skipped"] == 8.0 and metrics["train/actor/epochs"] == 2.0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


class ShiftedPolicy(nn.Module):
    """Whatever its weight, a sample's log-prob in train mode lies its first state entry above the
    eval-mode (proximal) one, 0: its proximal KL stays fixed through the update."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def evaluate(self, forward_inputs, actions):
        shift = forward_inputs["states"][:, 0] if self.training else torch.zeros(len(actions))
        return self.weight * 0.0 + shift, torch.zeros(len(actions)), self.weight * 0.0 + torch.zeros(len(actions))


def test_target_kl_reads_the_mean_kl_per_trained_decision_of_the_epoch():
    """One trained decision (KL e - 2 = 0.72) among 8, micro-batches of 2: the epoch's KL is 0.72 per
    decision and stops the update at target 0.5 after one epoch; a mean over micro-batches (three
    of the four hold no trained decision) would read 0.18 and run all three."""
    data = batch()
    data.forward_inputs["states"][:, 0] = 3.0  # masked rows: a large KL that must not count
    data.forward_inputs["states"][0, 0] = 1.0
    data.loss_mask = torch.arange(N) == 0
    data.behaviour_logprobs = torch.zeros(N)
    data = data.rows(torch.arange(8))
    policy = ShiftedPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    metrics = ppo_update(policy, optimizer, data, settings(epochs=3, minibatch_size=8, micro_batch_size=2,
                                                           target_kl=0.5, train_critic=False),
                         lambda t: t, torch.Generator().manual_seed(0))
    assert metrics["train/actor/epochs"] == 1.0 and metrics["train/actor/optimizer_steps"] == 1.0
    metrics = ppo_update(policy, optimizer, data, settings(epochs=3, minibatch_size=8, micro_batch_size=2,
                                                           target_kl=0.8, train_critic=False),
                         lambda t: t, torch.Generator().manual_seed(0))
    assert metrics["train/actor/epochs"] == 3.0


def test_log_std_is_clamped():
    head = GaussianHead(1, 2, init_log_std=0.0)
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([-30.0, 30.0]))
    std = head.distribution(torch.zeros(1, 2)).stddev[0]
    torch.testing.assert_close(std, torch.tensor([LOG_STD_MIN, LOG_STD_MAX]).exp())
    logprob, entropy = head.log_prob_entropy(torch.zeros(1, 2), torch.zeros(1, 1, 2))
    assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()


def test_rollout_refuses_nonfinite_policy_outputs():
    from embodied_async.workers.rollout_worker import RolloutWorker

    worker = types.SimpleNamespace(version=7)
    RolloutWorker._check_finite(worker, logprobs=torch.zeros(4), values=torch.ones(4))
    with pytest.raises(FloatingPointError, match=r"version 7\) produced non-finite values for sub-envs \[2\]"):
        RolloutWorker._check_finite(worker, logprobs=torch.zeros(4), values=torch.tensor([0, 1, float("nan"), 2]))


def test_policy_learning_rate_warms_up_after_the_critic_warm_up():
    policy = TinyPolicy()
    optimizer = torch.optim.Adam([
        {"params": [*policy.body.parameters(), *policy.head.parameters()], "name": "policy", "lr": 1e-2},
        {"params": list(policy.critic.parameters()), "name": "value", "lr": 5e-2},
    ])
    seen, step = [], optimizer.step

    def recording_step(*args, **kwargs):
        seen.append({g["name"]: g["lr"] for g in optimizer.param_groups})
        first_weight = policy.body[0].weight.detach().clone()
        step(*args, **kwargs)
        seen[-1]["moved"] = float((policy.body[0].weight - first_weight).abs().max())

    optimizer.step = recording_step
    policy.train()
    # 2 epochs x 4 minibatches = 8 steps: 2 train the critic alone, then 6 policy steps
    ppo_update(policy, optimizer, batch(), settings(critic_warmup_left=2, policy_lr=1e-2, policy_lr_warmup_steps=4),
               lambda t: t, torch.Generator().manual_seed(0))
    assert [s["policy"] for s in seen[2:]] == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    assert all(s["value"] == 5e-2 for s in seen)
    assert seen[0]["moved"] == seen[1]["moved"] == 0.0  # the critic warm-up leaves the policy alone
    # Adam's first step moves a weight by ~lr whatever its gradient: here a quarter of it
    assert seen[2]["moved"] == pytest.approx(2.5e-3, rel=0.01)
    # a later update continues the ramp where the earlier ones left it
    seen.clear()
    ppo_update(policy, optimizer, batch(), settings(policy_lr=1e-2, policy_lr_warmup_steps=8, policy_steps_before=6),
               lambda t: t, torch.Generator().manual_seed(0))
    assert [s["policy"] for s in seen] == pytest.approx([8.75e-3] + [1e-2] * 7)


def test_a_cosine_policy_schedule_scales_each_update_and_keeps_the_warm_up(make_config):
    """actor.policy_lr_schedule=cosine: update v's policy rate is actor.lr x the cosine at
    v / runner.max_steps (down to policy_min_lr_ratio), times the warm-up's ramp; the value rate
    is left alone."""
    from embodied_async.algorithms.ppo import UpdateSettings

    cfg = make_config("actor.policy_lr_schedule=cosine", "actor.policy_min_lr_ratio=0.2", "runner.max_steps=10",
                      "actor.lr=1e-2")
    factors = [UpdateSettings.from_config(cfg, 1, version=v).policy_lr_factor for v in (0, 5, 10, 20)]
    assert factors == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert UpdateSettings.from_config(make_config(), 1, version=5).policy_lr_factor == 1.0
    policy = TinyPolicy()
    optimizer = torch.optim.Adam([
        {"params": [*policy.body.parameters(), *policy.head.parameters()], "name": "policy", "lr": 1e-2},
        {"params": list(policy.critic.parameters()), "name": "value", "lr": 5e-2},
    ])
    seen, step = [], optimizer.step
    optimizer.step = lambda *a, **k: (seen.append({g["name"]: g["lr"] for g in optimizer.param_groups}), step(*a, **k))
    policy.train()
    ppo_update(policy, optimizer, batch(), settings(policy_lr=1e-2, policy_lr_warmup_steps=2, policy_lr_factor=0.5),
               lambda t: t, torch.Generator().manual_seed(0))
    assert [s["policy"] for s in seen] == pytest.approx([2.5e-3] + [5e-3] * 7)
    assert all(s["value"] == 5e-2 for s in seen)
