"""env.privileged_states: an env rendering images also gives the vector the same task gives in its
state observation mode, for the same sim state (a state-trained teacher acts on it while a dataset
records the images); and EnvSpec.control_hz, the rate a dataset of the env's episodes has."""

import numpy as np
import pytest

from embodied_async.config import ConfigError
from embodied_async.registry import build_env

pytestmark = pytest.mark.slow  # builds simulators

pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")


def maniskill(**overrides):
    pytest.importorskip("mani_skill")
    from envs.maniskill import ManiSkillConfig

    return ManiSkillConfig(**{"task": "PushCube-v1", "control_mode": "pd_ee_delta_pos", "max_episode_steps": 50,
                              **overrides})


def assert_same_states_as_state_mode(rgb_env, state_env, steps: int):
    """Reset both with one seed and drive them with the same random actions up to the time limit;
    the rgb env's privileged states equal the state env's states at every step, the last one
    (``final_obs``) included. (After an unseeded auto-reset the two draw different episodes:
    ManiSkill's episode RNG is not the same across obs modes, so the comparison stops there.)"""
    seen = [(rgb_env.reset(seed=11).obs, state_env.reset(seed=11).obs)]
    rng = np.random.default_rng(0)
    low, high = np.array(rgb_env.spec.action_low), np.array(rgb_env.spec.action_high)
    for step in range(steps):
        actions = rng.uniform(low, high, (rgb_env.num_envs, 1, len(low))).astype(np.float32)
        a, b = rgb_env.step(actions), state_env.step(actions)
        assert a.dones.all() == (step == steps - 1) and b.dones.all() == (step == steps - 1)
        seen.append((a.final_obs, b.final_obs) if a.dones.all() else (a.obs, b.obs))
    for privileged, state in seen:
        assert privileged["privileged_states"].dtype == np.float32
        np.testing.assert_array_equal(privileged["privileged_states"], state["states"])


@pytest.mark.slow
def test_maniskill_privileged_states_are_the_state_mode_vector():
    rgb = build_env(maniskill(obs_mode="rgb", image_size=[32, 32], privileged_states=True, max_episode_steps=4),
                    num_envs=2, seed=0)
    state = build_env(maniskill(obs_mode="state", max_episode_steps=4), num_envs=2, seed=0)
    try:
        assert rgb.spec.obs_shapes["privileged_states"] == state.spec.obs_shapes["states"] == (35,)
        # the rgb mode's own states leave the object poses and the goal out
        assert rgb.spec.obs_shapes["states"][0] < 35 and "main_images" in rgb.spec.obs_shapes
        assert_same_states_as_state_mode(rgb, state, steps=4)
        assert rgb.spec.control_hz == state.spec.control_hz == 20.0  # PushCube: 100 Hz physics, 5 steps per action
    finally:
        rgb.close()
        state.close()


def test_maniskill_privileged_states_need_the_cpu_backend():
    with pytest.raises(ConfigError, match="env.privileged_states=true needs env.sim_backend=cpu"):
        maniskill(obs_mode="rgb", privileged_states=True, sim_backend="gpu").check()


def test_metaworld_privileged_states_are_the_state_mode_vector():
    pytest.importorskip("metaworld")
    from envs.mujoco.configuration_mujoco import MetaWorldConfig

    common = dict(task="reach-v3", max_episode_steps=4)
    rgb = build_env(MetaWorldConfig(obs_mode="rgb", image_size=[16, 16], privileged_states=True, **common), 2, 0)
    state = build_env(MetaWorldConfig(obs_mode="state", **common), 2, 0)
    try:
        assert rgb.spec.obs_shapes["states"] == (4,) and rgb.spec.obs_shapes["privileged_states"] == (39,)
        assert_same_states_as_state_mode(rgb, state, steps=4)
        assert rgb.spec.control_hz == 80.0  # MuJoCo's 2.5 ms step, 5 per action
    finally:
        rgb.close()
        state.close()


def test_without_the_flag_there_are_no_privileged_states():
    pytest.importorskip("metaworld")
    from envs.mujoco.configuration_mujoco import MetaWorldConfig

    env = build_env(MetaWorldConfig(task="reach-v3"), 1, 0)
    try:
        assert "privileged_states" not in env.reset(seed=0).obs
    finally:
        env.close()
