"""The env families' scripted experts (env.scripted_expert): ours for ManiSkill PushCube, PullCube and
PickCube in end-effector and joint delta control, Meta-World's own policies; they solve most
episodes, and refuse tasks and control modes they do not know, naming the ones they do."""

import importlib

import numpy as np
import pytest

from embodied_async.registry import build_env

pytestmark = pytest.mark.slow  # builds simulators

pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")


def expert_of(cfg, env):
    module, _, name = type(cfg).scripted_expert.partition(":")
    return getattr(importlib.import_module(module), name)(cfg, env)


def success_rate(cfg, episodes: int, seed: int = 100) -> float:
    """Episodes of one sub-env, each from its own seed, driven by the family's expert."""
    env = build_env(cfg, 1, 0)
    try:
        expert, successes = expert_of(cfg, env), []
        for episode in range(episodes):
            out = env.reset(seed=seed + episode)
            while True:
                actions = expert(out.obs)
                assert actions.shape == (1, 1, env.spec.action_dim) and actions.dtype == np.float32
                assert np.all(np.abs(actions) <= 1.0)  # within the env's bounds, not clipped by it
                out = env.step(actions)
                if out.dones[0]:
                    successes.append(bool(out.successes[0]))
                    break
        return float(np.mean(successes))
    finally:
        env.close()


def maniskill(**overrides):
    pytest.importorskip("mani_skill")
    from envs.maniskill import ManiSkillConfig

    return ManiSkillConfig(**{"obs_mode": "state", "max_episode_steps": 50, **overrides})


@pytest.mark.slow
@pytest.mark.parametrize("task_id, control_mode", [
    ("PushCube-v1", "pd_ee_delta_pos"), ("PushCube-v1", "pd_joint_delta_pos"), ("PullCube-v1", "pd_ee_delta_pos"),
    ("PickCube-v1", "pd_ee_delta_pos"), ("PickCube-v1", "pd_joint_delta_pos")])
def test_maniskill_expert_solves_most_episodes(task_id, control_mode):
    assert success_rate(maniskill(task=task_id, control_mode=control_mode), episodes=8) >= 0.75


@pytest.mark.slow
def test_metaworld_expert_solves_reach():
    pytest.importorskip("metaworld")
    from envs.mujoco.configuration_mujoco import MetaWorldConfig

    assert success_rate(MetaWorldConfig(task="reach-v3", max_episode_steps=150), episodes=4) >= 0.75


@pytest.mark.parametrize("overrides, message", [
    ({"task": "StackCube-v1"},
     "no scripted expert for ManiSkill task 'StackCube-v1'.*PushCube-v1, PullCube-v1, PickCube-v1"),
    ({"task": "PushCube-v1", "control_mode": "pd_joint_pos"},
     "acts in env.control_mode pd_ee_delta_pos / pd_ee_delta_pose / pd_joint_delta_pos, not 'pd_joint_pos'"),
    ({"task": "PushCube-v1", "robot": "fetch"}, "drive the panda arm"),
])
def test_maniskill_expert_refuses_what_it_does_not_know(overrides, message):
    cfg = maniskill(**overrides)
    with pytest.raises(ValueError, match=message):
        expert_of(cfg, env=None)  # refused from the config, before any env is read


def test_metaworld_expert_refuses_a_task_without_a_policy():
    pytest.importorskip("metaworld")
    from envs.mujoco.configuration_mujoco import MetaWorldConfig

    with pytest.raises(ValueError, match="no scripted policy for env.task='reach-v9'.*reach-v3"):
        expert_of(MetaWorldConfig(task="reach-v9"), env=None)
