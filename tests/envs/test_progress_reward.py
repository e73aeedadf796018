"""The ``progress`` named reward: the task's dense reward and success as a potential, paid as
differences, so an episode's return is its last step's potential (success first, then closeness)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill")
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

from embodied_async.config import ConfigError  # noqa: E402
from embodied_async.registry import build_env  # noqa: E402
from envs.maniskill import ManiSkillConfig  # noqa: E402
from envs.maniskill.rewards import ProgressReward  # noqa: E402


def paid(reward: ProgressReward, steps, row: int = 0):
    return [float(reward.step({"task_reward": np.array([dense]), "success": np.array([success])}, [row])[0])
            for dense, success in steps]


def test_an_episode_returns_its_last_potential_and_a_success_outranks_every_failure():
    rewards = paid(ProgressReward(1), [(0.2, 0), (0.5, 0), (0.4, 0), (1.0, 1)])
    np.testing.assert_allclose(rewards, [0.1, 0.15, -0.05, 1.3], atol=1e-6)
    assert sum(rewards) == pytest.approx(1.5)
    # a failure that ends next to the goal earns less than any success, more than one far away
    near, far = sum(paid(ProgressReward(1), [(0.9, 0)] * 20)), sum(paid(ProgressReward(1), [(0.1, 0)] * 3))
    assert far < near < 0.5 < sum(rewards)
    weighted = ProgressReward(2, weights={"progress": 1.0, "success": 0.0})
    assert paid(weighted, [(0.3, 0), (0.7, 1)], row=1) == pytest.approx([0.3, 0.4])
    weighted.reset([1])
    assert paid(weighted, [(0.3, 0)], row=1) == pytest.approx([0.3])  # a new episode starts from zero


def test_progress_needs_a_dense_reward_mode_and_known_weights():
    with pytest.raises(ConfigError, match=r"env.reward_mode='sparse'.*normalized_dense"):
        ManiSkillConfig(task="PushCube-v1", reward="progress", reward_mode="sparse").check()
    with pytest.raises(ValueError, match="unknown keys \\['grasp'\\]"):
        ManiSkillConfig(task="PushCube-v1", reward="progress", reward_weights={"grasp": 1.0}).check()


@pytest.mark.slow
def test_on_pushcube_the_rewards_are_differences_of_the_tasks_dense_reward():
    def make(**overrides):
        cfg = ManiSkillConfig(task="PushCube-v1", max_episode_steps=6, control_mode="pd_ee_delta_pos", **overrides)
        cfg.check()
        return build_env(cfg, num_envs=2, seed=0)

    shaped, dense = make(reward="progress"), make()
    try:
        shaped.reset(seed=5), dense.reset(seed=5)
        actions = np.random.default_rng(0).uniform(-1, 1, (8, 2, 1, shaped.spec.action_dim)).astype(np.float32)
        got, task, done_at = [], [], []
        for step, action in enumerate(actions):
            a, b = shaped.step(action), dense.step(action)
            got.append(a.rewards), task.append(b.rewards)
            if a.dones.any():
                done_at.append(step)
        got, task = np.array(got), np.array(task)
        assert done_at and done_at[0] == 5  # the time limit: the 6th step ends both episodes
        potential = 0.5 * task[:6]  # random actions: no success
        np.testing.assert_allclose(got[:6], np.diff(potential, axis=0, prepend=0.0), atol=1e-5)
        np.testing.assert_allclose(got[:6].sum(0), potential[5], atol=1e-5)
        # after the auto-reset the next episode's potential starts from zero again
        np.testing.assert_allclose(got[6], 0.5 * task[6], atol=1e-5)
    finally:
        shaped.close(), dense.close()
