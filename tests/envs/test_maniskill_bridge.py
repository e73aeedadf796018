"""The Bridge digital twins' settings, checked without their assets: supported modes read from
the task classes at start-up, and the named grasp/place reward on scripted info sequences."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill")
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

from embodied_async.config import ConfigError  # noqa: E402
from embodied_async.registry import build_env  # noqa: E402
from envs.maniskill import ManiSkillConfig  # noqa: E402
from envs.maniskill.rewards import GraspPlaceReward  # noqa: E402

# the Bridge twins of ManiSkill 3.0.1 (also listed in configs/env/maniskill_bridge_carrot.yaml)
BRIDGE_TASKS = ["PutCarrotOnPlateInScene-v1", "PutEggplantInBasketScene-v1",
                "StackGreenCubeOnYellowCubeBakedTexInScene-v1", "PutSpoonOnTableClothInScene-v1"]


def bridge_config(task_id: str, **overrides) -> ManiSkillConfig:
    settings = dict(task=task_id, obs_mode="rgb+segmentation", reward_mode="none", reward="grasp_place",
                    control_mode=None, sim_backend="gpu", image_size=[480, 640])
    return ManiSkillConfig(**{**settings, **overrides})


@pytest.mark.parametrize("task_id", BRIDGE_TASKS)
def test_bridge_tasks_accept_the_recipe_modes(task_id):
    bridge_config(task_id).check()  # no assets here: only their absence goes unreported


@pytest.mark.parametrize("task_id", BRIDGE_TASKS)
def test_rgb_obs_mode_is_refused_naming_the_supported_one(task_id):
    with pytest.raises(ConfigError) as err:
        bridge_config(task_id, obs_mode="rgb").check()
    message = str(err.value)
    assert task_id in message and "env.obs_mode='rgb'" in message and "['rgb+segmentation']" in message


def test_a_reward_mode_the_twins_lack_is_refused_pointing_at_named_rewards():
    with pytest.raises(ConfigError, match=r"supports \['none'\].*env.reward"):
        bridge_config(BRIDGE_TASKS[0], reward_mode="normalized_dense").check()


def test_tasks_with_image_textures_accept_both_image_modes():
    for mode in ("rgb", "rgb+segmentation"):
        ManiSkillConfig(task="PushCube-v1", obs_mode=mode).check()


def test_unknown_reward_and_weight_names_are_config_errors():
    with pytest.raises(ConfigError, match="env.reward"):
        bridge_config(BRIDGE_TASKS[0], reward="grasp_and_place").check()
    with pytest.raises(ValueError, match="unknown keys \\['grip'\\]"):
        bridge_config(BRIDGE_TASKS[0], reward_weights={"grip": 1.0}).check()


def scripted_rewards(reward: GraspPlaceReward, steps, row: int = 0):
    out = []
    for grasped, sustained, success in steps:
        info = {"is_src_obj_grasped": np.array([grasped]), "consecutive_grasp": np.array([sustained]),
                "success": np.array([success])}
        out.append(float(reward.step(info, [row])[0]))
    return out


def test_grasp_place_reward_pays_potential_differences():
    reward = GraspPlaceReward(num_envs=2)
    # reach, grasp, keep holding, held 5 steps in a row, on the plate, stays there, knocked off
    # (the task keeps "grasped" and "sustained" true for the rest of the episode once reached)
    steps = [(0, 0, 0), (1, 0, 0), (1, 0, 0), (1, 1, 0), (1, 1, 1), (1, 1, 1), (1, 1, 0)]
    got = scripted_rewards(reward, steps)
    np.testing.assert_allclose(got, [0.0, 0.1, 0.0, 0.1, 1.0, 0.0, -1.0], atol=1e-6)
    assert sum(got) == pytest.approx(0.2)  # the final potential
    # success without a grasp (object pushed onto the plate) earns no success bonus
    assert scripted_rewards(GraspPlaceReward(1), [(0, 0, 1)]) == [0.0]


def test_grasp_place_reward_starts_each_episode_from_zero_per_sub_env():
    reward = GraspPlaceReward(num_envs=2, weights={"success": 2.0})
    assert scripted_rewards(reward, [(1, 1, 1)], row=0) == pytest.approx([2.2])
    assert scripted_rewards(reward, [(1, 0, 0)], row=1) == pytest.approx([0.1])  # rows are independent
    reward.reset([0])
    assert scripted_rewards(reward, [(1, 1, 1)], row=0) == pytest.approx([2.2])  # not 0: a new episode
    assert scripted_rewards(reward, [(1, 0, 0)], row=1) == pytest.approx([0.0])


def test_named_reward_on_a_task_without_its_info_keys_fails_at_start_up_naming_them():
    with pytest.raises(ValueError, match=r"needs the info keys .*reports no \['is_src_obj_grasped'"):
        build_env(ManiSkillConfig(task="PushCube-v1", reward="grasp_place", control_mode="pd_ee_delta_pos"),
                  num_envs=1, seed=0)
    with pytest.raises(ConfigError, match="env.reward is null"):
        ManiSkillConfig(task="PushCube-v1", reward_weights={"grasp": 1.0}).check()
