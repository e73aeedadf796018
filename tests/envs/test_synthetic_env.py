"""The synthetic image env: registered like any env, camera-shaped frames, a scripted reward."""

import numpy as np

from embodied_async.contracts import Env
from embodied_async.registry import build_env, family_config


def make(num_envs=3, **overrides):
    cfg = family_config("env", "synthetic_image")(**{"image_size": [48, 64], "max_episode_steps": 30, **overrides})
    cfg.check()
    return build_env(cfg, num_envs=num_envs, seed=0)


def test_frames_spec_and_protocol():
    env = make()
    assert isinstance(env, Env)
    out = env.reset(seed=1)
    frames = out.obs["main_images"]
    assert frames.shape == (3, 48, 64, 3) and frames.dtype == np.uint8
    assert len(np.unique(frames.reshape(-1, 3), axis=0)) > 100  # textured, not one colour
    assert env.spec.obs_shapes["main_images"] == (48, 64, 3) and env.spec.action_dim == 7
    assert out.obs["task_descriptions"] == ["move the cursor onto the marker"] * 3


def test_moving_toward_the_marker_pays_and_reaching_it_succeeds():
    env = make(num_envs=1, terminal_on_success=True)
    env.reset(seed=0)
    target, total, done = float(env.targets[0]), 0.0, False
    for _ in range(30):
        action = np.zeros((1, 1, 7), np.float32)
        action[0, 0, 0] = np.clip((target - env.cursors[0]) / 0.1, -1, 1)
        out = env.step(action)
        total += float(out.rewards[0])
        if out.dones[0]:
            done = True
            break
    assert done and out.successes[0] and not out.bootstrap[0]  # success is terminal when configured
    assert abs(target) - 0.05 < total <= abs(target) + 1e-5  # the rewards sum to the distance covered
    assert out.final_obs is not None and abs(float(env.cursors[0])) == 0.0  # auto-reset for the next episode


def test_time_limit_truncates_and_bootstraps():
    env = make(num_envs=2, max_episode_steps=4)
    env.reset(seed=2)
    assert (np.abs(env.targets) > 0.1).all()  # this seed puts both markers out of reach of the start
    for _ in range(4):
        out = env.step(np.zeros((2, 1, 7), np.float32))  # standing still never reaches the marker
    assert out.dones.all() and out.bootstrap.all() and not out.successes.any()
