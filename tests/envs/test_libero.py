"""The LIBERO family: its simulators in child processes under ``.venv-libero`` (built by
``bash scripts/setup.sh --python-env libero``, which scripts/test.sh runs), checked at start-up
by asking LIBERO there."""

import numpy as np
import pytest

from embodied_async.config import ConfigError
from embodied_async.isolated.child import query
from embodied_async.registry import build_env, family_config
from envs.libero.libero_env import task_places

slow = pytest.mark.slow  # starts LIBERO in child processes (a scene builds in 3-15 s on a CPU)

FIRST_SPATIAL = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"


def config(**overrides):
    settings = dict(task=FIRST_SPATIAL, image_size=[32, 32], max_episode_steps=2, settle_steps=1)
    return family_config("env", "libero")(**{**settings, **overrides})


@slow
def test_two_sub_envs_reset_from_the_official_initial_states_step_and_auto_reset():
    env = build_env(config(), 2, 0)
    try:
        spec = env.spec
        assert spec.action_dim == 7 and spec.reports_success and spec.control_hz == 20.0
        assert spec.obs_shapes["main_images"] == (32, 32, 3) and spec.obs_shapes["wrist_images"] == (32, 32, 3)
        assert spec.obs_shapes["states"] == (8,) and spec.instruction.startswith("pick up the black bowl")
        first = env.reset(seed=[3, 3])  # one seed, one initial state
        np.testing.assert_allclose(first.obs["states"][0], first.obs["states"][1], atol=1e-6)
        other = env.reset(seed=[3, 4])
        assert not np.allclose(other.obs["states"][0], other.obs["states"][1], atol=1e-6) or \
            not np.array_equal(other.obs["main_images"][0], other.obs["main_images"][1])
        out = None
        for _ in range(2):  # the time limit of 2 steps: truncated, bootstrapped, auto-reset
            out = env.step(np.zeros((2, 1, 7), np.float32))
        assert out.dones.all() and out.bootstrap.all() and not out.successes.any()
        assert out.final_obs is not None and out.obs["main_images"].dtype == np.uint8
    finally:
        env.close()


@slow
def test_episodes_go_through_the_official_initial_states_and_images_are_turned_upright():
    """Sub-env 1 of a task's 2 takes states 1, 3, 5 (the task's sub-envs together: 0, 1, 2, ...);
    a seed starts from that state; init_state fixes it. Images: LIBERO renders upside down, and
    OpenVLA's and openpi's LIBERO evaluations and datasets turn both cameras by 180 degrees."""
    settings = {**config().child_config(), "place": 1, "count": 2}
    seen = query("libero", "libero", "tests.support.libero_child_checks:reset_sequence_and_images", settings)
    assert seen["plain"] == [1, 3, 5] and seen["seeded"] == [7, 9] and seen["fixed"] == [4, 4]
    for camera in ("main", "wrist"):
        assert seen[camera].shape == (32, 32, 3) and seen[camera].std() > 0
        np.testing.assert_array_equal(seen[camera], seen[f"{camera}_raw"][::-1, ::-1])
        assert not np.array_equal(seen[camera], seen[f"{camera}_raw"])


@slow
def test_bad_names_are_refused_at_start_up_listing_the_valid_ones():
    with pytest.raises(ConfigError, match="env.suite='libero_nowhere' is not a LIBERO suite; the suites: .*goal"):
        config(suite="libero_nowhere").check()
    with pytest.raises(ConfigError, match=f"env.task='fly' is not a task of libero_spatial; its tasks: "
                                          f"{FIRST_SPATIAL},"):
        config(task="fly").check()
    with pytest.raises(ConfigError, match="env.wrist_camera='hand' is not a camera of LIBERO's scenes"):
        config(wrist_camera="hand").check()
    with pytest.raises(ConfigError, match=f"env.init_state=50 is out of range: {FIRST_SPATIAL} has 50 initial "
                                          "states, 0 to 49"):
        config(init_state=50).check()
    config().check()


def test_each_sub_env_has_its_place_among_its_tasks_sub_envs():
    assert task_places(["a", "a", "a"]) == [0, 1, 2]
    assert task_places(["a", "b", "a", "b"]) == [0, 0, 1, 1]  # env.tasks spreads tasks round robin
