"""Group-relative (value-free) advantages against hand-worked values, and the asymmetric clip
they train under."""

import pytest
import torch

from embodied_async.algorithms import EpisodeCutError, decoupled_ppo_actor_loss, group_relative_advantages

# T = 3 decisions of B = 4 sub-envs in groups of 2. Group 0: sub-env 0 succeeds at t = 1 (return 1;
# its t = 2 belongs to the auto-reset episode after it), sub-env 1 fails at the time limit (return
# 0.5 from a partial reward). Group 1: both succeed (returns 1 and 1): nothing to compare, dropped.
REWARDS = torch.tensor([[0.0, 0.5, 0.0, 1.0],
                        [1.0, 0.0, 1.0, 0.0],
                        [7.0, 0.0, 0.0, 0.0]])
DONES = torch.tensor([[False, False, False, True],
                      [True, False, True, False],
                      [False, True, False, True]])


def test_each_episode_gets_its_return_minus_the_groups_mean_divided_by_its_std():
    advantages, mask, metrics = group_relative_advantages(REWARDS, DONES, group_size=2, normalize_std=True)
    # group 0: returns (1, 0.5), mean 0.75, population std 0.25 -> (+1, -1) at every step of each episode
    expected = torch.tensor([[1.0, -1.0, 0.0, 0.0],
                             [1.0, -1.0, 0.0, 0.0],
                             [0.0, -1.0, 0.0, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-4)
    assert mask.tolist() == [[True, True, False, False],
                             [True, True, False, False],
                             [False, True, False, False]]  # after sub-env 0's end, and group 1: out
    assert metrics["train/grpo/groups"] == 2.0
    assert metrics["train/grpo/groups_dropped"] == 1.0
    assert metrics["train/grpo/trained_step_fraction"] == pytest.approx(5 / 12)


def test_without_std_normalisation_the_advantage_is_the_return_minus_the_mean():
    advantages, mask, _ = group_relative_advantages(REWARDS, DONES, group_size=2, normalize_std=False)
    assert advantages[0, :2].tolist() == pytest.approx([0.25, -0.25])
    assert advantages[2, 1].item() == pytest.approx(-0.25)
    assert not mask[:, 2:].any()


def test_a_group_of_four_with_one_success_and_an_all_failed_group():
    dones = torch.zeros(2, 8, dtype=torch.bool)
    dones[1] = True
    rewards = torch.zeros(2, 8)
    rewards[1, 2] = 1.0  # group 0 (sub-envs 0-3): one success of four; group 1 (4-7): all failed
    advantages, mask, metrics = group_relative_advantages(rewards, dones, group_size=4, normalize_std=False)
    assert advantages[0, :4].tolist() == pytest.approx([-0.25, -0.25, 0.75, -0.25])
    assert mask[:, :4].all() and not mask[:, 4:].any()
    assert metrics["train/grpo/groups_dropped"] == 1.0


def test_per_episode_weighting_makes_every_episode_weigh_alike_at_the_same_scale():
    """algorithm.group_episode_weight=episode: sub-env 0's episode has 2 steps, sub-env 1's 3; scaled
    by the mean length over their own (2.5 / 2 and 2.5 / 3), each episode's advantages sum to
    the same magnitude, and the trained steps' total weight is unchanged."""
    steps, _, _ = group_relative_advantages(REWARDS, DONES, group_size=2, normalize_std=True)
    episodes, mask, _ = group_relative_advantages(REWARDS, DONES, group_size=2, normalize_std=True,
                                                  episode_weight="episode")
    assert episodes[:, 0].sum().item() == pytest.approx(2.5, abs=1e-4)  # 2 steps x (+1 x 1.25)
    assert episodes[:, 1].sum().item() == pytest.approx(-2.5, abs=1e-4)  # 3 steps x (-1 x 2.5 / 3)
    assert steps[:, 0].sum().item() == pytest.approx(2.0, abs=1e-4)
    assert steps[:, 1].sum().item() == pytest.approx(-3.0, abs=1e-4)
    assert episodes[mask].abs().sum().item() == pytest.approx(steps[mask].abs().sum().item())


def test_a_group_with_an_episode_ended_by_a_dropped_sample_is_dropped_whole():
    """env.on_nonfinite=drop ends an episode at the dropped sample (done, not valid): its return is
    unknown, so its group is not compared as if complete."""
    rewards, dones = torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool)
    rewards[0, 0] = 1.0  # group 0: sub-env 0 succeeds, sub-env 1 "fails" at a dropped sample
    rewards[0, 2] = 1.0  # group 1: a success and a whole failure
    valid = torch.ones(2, 4, dtype=torch.bool)
    valid[0, 1] = False
    _, mask, metrics = group_relative_advantages(rewards, dones, group_size=2, normalize_std=False, valid=valid)
    assert not mask[:, :2].any() and mask[0, 2:].all()
    assert metrics["train/grpo/groups_incomplete"] == 1.0 and metrics["train/grpo/groups_dropped"] == 1.0
    _, unchecked, _ = group_relative_advantages(rewards, dones, group_size=2, normalize_std=False)
    assert unchecked[0, :2].all()  # without the valid mask the group would be compared


def test_an_episode_cut_by_the_trajectory_end_is_refused_naming_the_sub_env():
    dones = DONES.clone()
    dones[:, 2] = False
    with pytest.raises(EpisodeCutError, match=r"sub-envs \[2\].*rollout.num_steps"):
        group_relative_advantages(REWARDS, dones, group_size=2, normalize_std=True)


@pytest.mark.parametrize("size", [1, 3])
def test_groups_must_have_two_members_and_divide_the_sub_envs(size):
    with pytest.raises(ValueError, match="group_size"):
        group_relative_advantages(REWARDS, DONES, group_size=size, normalize_std=True)


def test_the_asymmetric_clip_bounds_the_ratio_at_1_minus_low_and_1_plus_high():
    """DAPO's clip: a positive advantage may raise the ratio to 1 + 0.28, a negative one lower it
    only to 1 - 0.2; beyond the bounds the gradient is zero."""
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    ratios = torch.tensor([1.2, 1.5, 0.9, 0.5])
    logprobs = ratios.log().requires_grad_()
    zeros = torch.zeros(4)
    loss, metrics = decoupled_ppo_actor_loss(logprobs, zeros, zeros, advantages, clip_ratio_low=0.2,
                                             clip_ratio_high=0.28, clip_ratio_c=None, behave_weight_threshold=None,
                                             loss_normalizer=1.0)
    # per sample: -A * clip(r): -1.2 (inside), -1.28 (clipped high), 0.9 (inside), 0.8 (clipped low)
    assert loss.item() == pytest.approx(-1.2 - 1.28 + 0.9 + 0.8)
    loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([-1.2, 0.0, 0.9, 0.0])
    assert metrics["train/actor/clip_fraction"] == pytest.approx(0.5)
