"""ManiSkill adapter: built through the registry, CPU backend, offline (no asset downloads)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill")
# ManiSkill runs np.isnan on torch actions internally; the warning is theirs, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

from embodied_async.config import ConfigError  # noqa: E402
from embodied_async.contracts import Env  # noqa: E402
from embodied_async.registry import build_env  # noqa: E402
from envs.maniskill import ManiSkillConfig, bootstrap_flags, task_instruction  # noqa: E402

pytestmark = pytest.mark.slow  # builds simulators


def make_env(num_envs: int = 2, seed: int = 0, **overrides):
    cfg = ManiSkillConfig(**{"task": "PushCube-v1", "max_episode_steps": 50, "control_mode": "pd_ee_delta_pos",
                             **overrides})
    return build_env(cfg, num_envs=num_envs, seed=seed)


@pytest.fixture
def env():
    env = make_env()
    yield env
    env.close()


def random_chunk(env, chunks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (env.num_envs, chunks, env.spec.action_dim)).astype(np.float32)


def test_state_mode_spec_and_reset(env):
    spec = env.spec
    assert env.num_envs == 2
    assert set(spec.obs_shapes) == {"states"}
    (dim,) = spec.obs_shapes["states"]
    assert spec.action_dim == 4 and spec.num_action_chunks == 1
    assert len(spec.action_low) == len(spec.action_high) == 4
    assert spec.obs_dtypes == {"states": "float32"} and spec.instruction == "push the cube to the goal region"
    assert isinstance(env, Env)  # the typed contract every env family meets
    out = env.reset(seed=3)
    assert out.obs["states"].shape == (2, dim) and out.obs["states"].dtype == np.float32
    assert out.obs["task_descriptions"] == ["push the cube to the goal region"] * 2
    assert out.rewards.dtype == np.float32 and not out.rewards.any()
    assert not (out.dones.any() or out.bootstrap.any() or out.successes.any())
    assert out.valid.all() and out.final_obs is None
    # Sub-env i is seeded with seed + i: two sub-envs start in different states.
    assert not np.allclose(out.obs["states"][0], out.obs["states"][1])


def test_chunk_of_two_equals_two_single_steps():
    chunked, single = make_env(num_action_chunks=2), make_env()
    try:
        actions = random_chunk(chunked, 2)
        out = chunked.step(actions * 5.0)  # out-of-bounds actions are clipped to [-1, 1]
        first = single.step(np.clip(actions[:, :1] * 5.0, -1, 1))
        second = single.step(np.clip(actions[:, 1:] * 5.0, -1, 1))
        assert out.rewards.shape == (2,) and out.rewards.dtype == np.float32
        assert out.dones.dtype == bool and not out.dones.any()
        np.testing.assert_allclose(out.rewards, first.rewards + second.rewards, rtol=1e-5)
        np.testing.assert_allclose(out.obs["states"], second.obs["states"], rtol=1e-5, atol=1e-6)
    finally:
        chunked.close()
        single.close()


def test_time_limit_bootstraps_and_auto_resets():
    env = make_env(max_episode_steps=3, num_action_chunks=2)
    try:
        reset_states = env.reset(seed=1).obs["states"]
        out = env.step(random_chunk(env, 2, seed=1))  # steps 1-2
        assert not out.dones.any() and out.final_obs is None
        out = env.step(random_chunk(env, 2, seed=2))  # step 3 hits the limit at sub-step 1
        assert out.dones.all() and out.bootstrap.all()
        assert out.final_obs is not None and set(out.final_obs) == set(out.obs)
        assert not np.allclose(out.final_obs["states"], out.obs["states"])
        assert not np.allclose(out.final_obs["states"], reset_states)
        # The new episode did not receive the chunk's remaining action.
        assert [int(e.unwrapped.elapsed_steps[0]) for e in env._envs] == [0, 0]
        out = env.step(random_chunk(env, 2, seed=3))
        assert not out.dones.any() and out.final_obs is None
    finally:
        env.close()


def test_a_seeded_reset_replays_the_auto_reset_episodes_whatever_else_draws_random_numbers():
    """An evaluation reset with one seed faces the same episodes in any process: each auto-reset
    episode follows from the sub-env's seed, not from torch's global RNG (which sampling uses)."""
    import torch

    def episode_starts(draws: int, seed: int):
        env = make_env(max_episode_steps=2)
        try:
            starts = [env.reset(seed=seed).obs["states"].copy()]
            for _ in range(3):  # three auto-resets per sub-env
                torch.rand(draws)  # a policy sampling in the same process
                for _ in range(2):
                    out = env.step(np.zeros((2, 1, env.spec.action_dim), np.float32))
                assert out.dones.all()
                starts.append(out.obs["states"].copy())
            return np.stack(starts)
        finally:
            env.close()

    first = episode_starts(draws=1, seed=7)
    np.testing.assert_array_equal(first, episode_starts(draws=1000, seed=7))
    assert not np.allclose(first[1:], first[:-1])  # every auto-reset is a new episode
    assert not np.allclose(first, episode_starts(draws=1, seed=8))


def test_vector_env_path_matches_cpu_path_on_finishing_chunk():
    """The GPU backend's code path (ManiSkillVectorEnv, in-place auto-reset), run on a 1-env CPU
    scene: a chunk that crosses the time limit reports the same reward and final observation."""
    import gymnasium as gym
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    cpu, vec = make_env(1, max_episode_steps=3), make_env(1, max_episode_steps=3)
    try:
        vec._envs.pop().close()
        vec._serial = None  # the GPU backend's path: no serial env
        cfg = vec.cfg
        kwargs = dict(obs_mode="state", control_mode=cfg.control_mode, max_episode_steps=3)
        kwargs.update(reward_mode=cfg.reward_mode, sim_backend="cpu", render_backend="cpu")
        base = gym.make("PushCube-v1", num_envs=1, **kwargs)
        vec._vec = ManiSkillVectorEnv(base, auto_reset=True, ignore_terminations=False)
        a, b = cpu.reset(seed=5), vec.reset(seed=5)
        np.testing.assert_allclose(a.obs["states"], b.obs["states"])
        first = random_chunk(cpu, 2, seed=4)
        a, b = cpu.step(first), vec.step(first)
        np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-5)
        chunk = random_chunk(cpu, 2, seed=5)  # finishes at its first sub-step
        a, b = cpu.step(chunk), vec.step(chunk)
        assert a.dones.all() and b.dones.all() and b.bootstrap.all()
        np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-5)  # 2nd sub-step ignored
        np.testing.assert_allclose(a.final_obs["states"], b.final_obs["states"], rtol=1e-5)
        assert int(vec._vec.base_env.elapsed_steps[0]) == 1  # applied to the new episode
    finally:
        cpu.close()
        vec.close()


def test_bootstrap_flags():
    terminated = np.array([True, False, True, False])
    truncated = np.array([False, True, True, False])
    assert bootstrap_flags(terminated, truncated, False).tolist() == [True, True, True, False]
    assert bootstrap_flags(terminated, truncated, True).tolist() == [False, True, False, False]


@pytest.mark.parametrize("terminal_on_success", [False, True])
def test_success_termination_bootstrap(terminal_on_success):
    env = make_env(terminal_on_success=terminal_on_success, num_action_chunks=2)
    try:
        sub_env = env._envs[0]
        original_step = sub_env.step

        def succeed(action):  # sub-env 0 reaches its goal at the first sub-step
            obs, reward, terminated, truncated, info = original_step(action)
            info = dict(info, success=np.array([True]))
            return obs, reward, np.array([True]), truncated, info

        sub_env.step = succeed
        out = env.step(random_chunk(env, 2))
        assert out.dones.tolist() == [True, False]
        assert out.successes.tolist() == [True, False]
        assert out.bootstrap.tolist() == [not terminal_on_success, False]
        assert out.final_obs is not None
        np.testing.assert_array_equal(out.final_obs["states"][1], out.obs["states"][1])
    finally:
        env.close()


def test_reset_envs_resets_only_those(env):
    env.step(random_chunk(env, 1))
    before = env.step(random_chunk(env, 1, seed=1)).obs["states"]
    obs = env.reset_envs([1])
    np.testing.assert_array_equal(obs["states"][0], before[0])
    assert not np.allclose(obs["states"][1], before[1])
    assert [int(e.unwrapped.elapsed_steps[0]) for e in env._envs] == [2, 0]
    assert len(obs["task_descriptions"]) == 2


def test_rgb_mode_images():
    env = make_env(obs_mode="rgb", image_size=[64, 64])
    try:
        assert env.spec.obs_shapes["main_images"] == (64, 64, 3)
        out = env.step(random_chunk(env, 1))
        images = out.obs["main_images"]
        assert images.shape == (2, 64, 64, 3) and images.dtype == np.uint8
        assert images.std() > 1.0  # a rendered scene, not a blank frame
        assert out.obs["states"].dtype == np.float32
        assert out.obs["states"].shape == (2,) + env.spec.obs_shapes["states"]
    finally:
        env.close()


def test_missing_assets_name_the_download_command():
    from mani_skill.utils import assets

    if assets.is_data_source_downloaded("bridge_v2_real2sim"):
        pytest.skip("Bridge assets are installed here")
    with pytest.raises(FileNotFoundError) as err:
        make_env(task="PutCarrotOnPlateInScene-v1", num_envs=1)
    message = str(err.value)
    assert "PutCarrotOnPlateInScene-v1" in message
    assert "python -m mani_skill.utils.download_asset bridge_v2_real2sim -y" in message


def test_unknown_task_and_bad_obs_mode():
    """The config's start-up check names both; the env (built from a checked config) still refuses
    an unknown task id, which it reads when it looks for the task's assets."""
    with pytest.raises(ValueError, match="PushCube-v1"):
        make_env(task="PushCub-v1")
    with pytest.raises(ConfigError, match="close: .*PushCube-v1"):
        ManiSkillConfig(task="PushCub-v1").check()
    with pytest.raises(ConfigError, match="env.obs_mode"):
        ManiSkillConfig(task="PushCube-v1", obs_mode="pointcloud").check()


def test_instructions():
    assert task_instruction("PickCube-v1") == "pick up the cube and move it to the goal"
    assert task_instruction("LiftPegUpright-v2") == "lift peg upright"
    assert task_instruction("PickSingleYCB-v1", "grab it") == "grab it"
    cfg = ManiSkillConfig(task="PushCube-v1", instruction="do the thing")
    env = build_env(cfg, num_envs=1, seed=0)
    try:
        assert env.reset().obs["task_descriptions"] == ["do the thing"]
    finally:
        env.close()


def test_one_seed_per_sub_env_starts_a_group_in_one_state_on_either_backend():
    """algorithm.adv_type=grpo's grouped resets: sub-envs given the same seed start alike, and the
    GPU backend's batched reset (here its code path on a one-env CPU scene) takes the same list."""
    import gymnasium as gym
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    env = make_env(4)
    try:
        states = env.reset([11, 11, 12, 12]).obs["states"]
        np.testing.assert_array_equal(states[0], states[1])
        np.testing.assert_array_equal(states[2], states[3])
        assert not np.allclose(states[0], states[2])
        np.testing.assert_array_equal(env.reset(11).obs["states"][0], states[0])  # an int: sub-env 0 gets it
        with pytest.raises(ValueError, match="3 seeds for 4 sub-envs"):
            env.reset([1, 2, 3])
    finally:
        env.close()
    cpu, vec = make_env(1), make_env(1)
    try:
        vec._envs.pop().close()
        vec._serial = None  # the GPU backend's path
        cfg = vec.cfg
        base = gym.make("PushCube-v1", num_envs=1, obs_mode="state", control_mode=cfg.control_mode,
                        reward_mode=cfg.reward_mode, sim_backend="cpu", render_backend="cpu")
        vec._vec = ManiSkillVectorEnv(base, auto_reset=True, ignore_terminations=False)
        np.testing.assert_allclose(vec.reset([11]).obs["states"], cpu.reset([11]).obs["states"], rtol=1e-6)
    finally:
        cpu.close()
        vec.close()
