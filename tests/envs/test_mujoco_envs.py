"""The MuJoCo families (robosuite, Meta-World, Fetch) and every shipped env YAML: each builds and
steps, renders images that are not one colour, has an instruction; names are checked at start-up;
the installed simulator packages are within the pinned ranges."""

import glob
import os

import numpy as np
import pytest
import yaml
from conftest import REPO_ROOT

from embodied_async.config import ConfigError

pytestmark = pytest.mark.slow  # builds simulators

MUJOCO_FAMILIES = ("robosuite", "metaworld", "fetch")


# The Bridge twins need ManiSkill's GPU simulator and downloaded assets (tests/envs/test_maniskill_bridge.py
# checks their config); every other shipped env YAML is built here.
NOT_BUILDABLE_HERE = {"maniskill_bridge_carrot"}


def shipped_env_yamls(families=MUJOCO_FAMILIES):
    found = []
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "configs", "env", "*.yaml"))):
        with open(path) as f:
            defaults = yaml.safe_load(f).get("defaults", [])
        family = next((d[: -len("_schema")] for d in defaults if isinstance(d, str) and d.endswith("_schema")), None)
        name = os.path.basename(path)[:-5]
        if family in families and name not in NOT_BUILDABLE_HERE:
            found.append(name)
    return found


def env_config(name, *overrides):
    """configs/env/<name>.yaml composed through Hydra into its family's config."""
    from hydra import compose, initialize_config_dir

    from embodied_async.config.hydra_schema import register_schema
    from embodied_async.config.validate import to_train_config

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        raw = compose(config_name="maniskill_async_ppo_mlp",
                      overrides=[f"env={name}", "runner.logger.log_path=/tmp/unused", *overrides])
    return to_train_config(raw).env


def build(cfg, num_envs=2, seed=0):
    from envs.mujoco.mujoco_env import MujocoEnv

    return MujocoEnv(cfg, num_envs, seed=seed)


def test_the_installed_simulators_are_within_the_pinned_ranges():
    from importlib.metadata import version

    import tomllib
    from packaging.requirements import Requirement

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        requirements = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
    pinned = {r.name: r.specifier for r in requirements}
    for package in ("mujoco", "robosuite", "metaworld", "gymnasium-robotics"):
        assert version(package) in pinned[package], f"{package} {version(package)} is outside {pinned[package]}"
    assert "3.10" not in pinned["mujoco"] and "3.12.0" not in pinned["mujoco"]  # robosuite's breaks stay out


def test_every_mujoco_family_ships_a_yaml():
    names = shipped_env_yamls()
    assert {env_config(n).name for n in names} == set(MUJOCO_FAMILIES), names


@pytest.mark.parametrize("name", shipped_env_yamls(MUJOCO_FAMILIES + ("maniskill", "synthetic_image")))
def test_every_shipped_yaml_builds_steps_and_renders(name):
    cfg = env_config(name, "env.obs_mode=rgb", "env.image_size=[64,64]") \
        if not name.startswith("synthetic") else env_config(name, "env.image_size=[64,64]")
    from embodied_async.registry import build_env

    env = build_env(cfg, 1, 0)
    try:
        assert env.spec.instruction and env.spec.instruction.strip()
        rng = np.random.default_rng(0)
        low, high = np.array(env.spec.action_low), np.array(env.spec.action_high)
        for _ in range(5):
            out = env.step(rng.uniform(low, high, (1, 1, len(low))).astype(np.float32))
        assert np.isfinite(out.rewards).all() and np.isfinite(out.obs["states"]).all()
        assert out.obs["task_descriptions"] == [env.spec.instruction]
        images = out.obs["main_images"]
        assert images.shape == (1, 64, 64, 3) and images.dtype == np.uint8
        for image in images:
            assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, "one colour"
        if "wrist_images" in out.obs:  # a second camera: its own picture
            assert np.abs(out.obs["wrist_images"].astype(int) - images).mean() > 10
    finally:
        env.close()


def test_state_observations_hold_the_task_state_and_episodes_end_at_the_time_limit():
    cfg = env_config("metaworld_reach", "env.max_episode_steps=3")
    env = build(cfg)
    try:
        first = env.reset(seed=5).obs["states"]
        assert first.shape == (2, 39) and not np.allclose(first[0, -3:], first[1, -3:])  # own goals
        assert np.array_equal(env.reset(seed=5).obs["states"], first)  # seeded
        zero = np.zeros((2, 1, 4), np.float32)
        outs = [env.step(zero) for _ in range(3)]
        assert not outs[0].dones.any() and not outs[1].dones.any()
        last = outs[2]
        assert last.dones.all() and last.bootstrap.all() and last.final_obs is not None  # truncation bootstraps
        assert not np.array_equal(last.final_obs["states"], last.obs["states"])  # the next episode began
    finally:
        env.close()


def test_a_chunk_of_actions_stops_at_the_episode_end():
    cfg = env_config("fetch_reach", "env.obs_mode=state", "env.max_episode_steps=4", "env.num_action_chunks=3")
    env = build(cfg)
    try:
        env.reset(seed=0)
        chunk = np.zeros((2, 3, 4), np.float32)
        assert not env.step(chunk).dones.any()  # steps 1-3
        out = env.step(chunk)  # step 4 ends it: the chunk's last two actions are dropped
        assert out.dones.all() and out.env_steps.tolist() == [1, 1]  # executed, not the whole chunk
        assert [sub.steps for sub in env.subs] == [0, 0]  # the next episode began
    finally:
        env.close()


def test_robosuite_robot_is_chosen_by_name():
    panda = env_config("robosuite_reach")
    ur5e = env_config("robosuite_reach", "env.robot=UR5e")
    states = {}
    for cfg in (panda, ur5e):
        env = build(cfg, num_envs=1)
        try:
            states[cfg.robot] = env.reset(seed=0).obs["states"]
            assert env.spec.action_dim == 4  # OSC_POSITION: x, y, z + gripper
        finally:
            env.close()
    assert states["Panda"].shape != states["UR5e"].shape  # 7 joints against 6


@pytest.mark.parametrize("override, message", [
    ("env.robot=Pandda", "env.robot='Pandda' is not a robosuite robot; robosuite 1.5.1 ships: Baxter"),
    ("env.task=Lfit", "env.task='Lfit' is not a robosuite task (close: Lift)"),
    ("env.controller=OSC", "env.controller='OSC' is not a robosuite arm controller; use one of: IK_POSE"),
    ("env.main_camera=topcam", "camera 'topcam' (env.main_camera / env.wrist_camera) is not in robosuite task"),
])
def test_wrong_robosuite_names_fail_at_start_up_listing_the_valid_ones(override, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        env_config("robosuite_reach", override)


@pytest.mark.parametrize("name, override, message", [
    ("metaworld_reach", "env.task=reach-v9", "env.task='reach-v9' is not a Meta-World task (close: reach-v3"),
    ("metaworld_reach", "env.main_camera=front", "env.main_camera='front' is not a Meta-World camera; its cameras: "),
    ("fetch_reach", "env.task=FetchReach-v9", "env.task='FetchReach-v9' is not a Fetch task (close: "),
    ("metaworld_reach", "env.max_episode_steps=600", "env.max_episode_steps=600 must be within 1-500"),
])
def test_wrong_task_and_camera_names_fail_at_start_up(name, override, message):
    with pytest.raises(ConfigError) as err:
        env_config(name, override)
    assert message in str(err.value)


def test_an_unstable_simulation_step_ends_the_episode_as_a_failure():
    import mujoco

    cfg = env_config("fetch_reach", "env.obs_mode=state")
    env = build(cfg)
    try:
        env.reset(seed=0)
        zero = np.zeros((2, 1, 4), np.float32)
        assert not env.step(zero).dones.any()
        # what MuJoCo records when it resets a diverging simulation mid-step
        env.sub_envs[1].mj_data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number += 1
        out = env.step(zero)
        assert out.dones.tolist() == [False, True] and not out.bootstrap[1] and not out.successes[1]
        assert out.rewards[1] == 0.0
        assert not env.step(zero).dones.any()  # counted once
        # the first step of an episode can diverge too, and MuJoCo's own reset of the data sends
        # its clock back even when the count happens to end where it was
        env.reset_envs([0])
        sub = env.sub_envs[0]
        real_step = sub.step

        def diverging_step(action):  # what mj_resetData leaves: the clock back at 0
            result = real_step(action)
            sub.mj_data.time = 0.0
            return result

        sub.step = diverging_step
        out = env.step(zero)
        assert out.dones.tolist() == [True, False] and not out.bootstrap[0]
    finally:
        env.close()


def test_reaching_the_goal_ends_the_episode_as_a_success_and_the_goal_is_drawn():
    cfg = env_config("fetch_reach", "env.num_envs=2")
    env = build(cfg)
    try:
        env.reset(seed=3)
        subs = env.sub_envs
        for sub in subs:  # the drawn marker is the goal of this episode
            target = sub.mj_data.site("target0").xpos
            assert np.allclose(target, sub._obs["desired_goal"], atol=1e-6)
        for _ in range(50):
            actions = np.zeros((2, 1, 4), np.float32)
            for i, sub in enumerate(subs):
                actions[i, 0, :3] = np.clip(10 * (sub._obs["desired_goal"] - sub._obs["achieved_goal"]), -1, 1)
            out = env.step(actions)
            if out.dones.any():
                break
        assert out.dones.all() and out.successes.all()
        assert out.bootstrap.all()  # terminal_on_success is false: the success end bootstraps
        assert out.final_obs is not None and not np.array_equal(out.final_obs["main_images"], out.obs["main_images"])
    finally:
        env.close()


def test_a_control_mode_the_robot_lacks_names_the_key_and_the_modes():
    from embodied_async.registry import build_env

    cfg = env_config("maniskill_pickcube_so100", "env.control_mode=pd_ee_delta_pos", "env.obs_mode=state")
    with pytest.raises(ValueError, match=r"env.control_mode='pd_ee_delta_pos' is not a control mode of so100 .*"
                                         r"pd_joint_delta_pos"):
        build_env(cfg, 1, 0)


def test_several_tasks_spread_over_the_sub_envs_and_the_evaluation_scores_each():
    """env.tasks: sub-env i runs tasks[i % 2] with its own instruction; an evaluation where only
    the reach sub-envs are driven to their goals scores reach 1 and drawer-close 0."""
    from embodied_async.data import PolicyOutput
    from embodied_async.evaluation import run_episodes
    from envs.mujoco.metaworld_tasks import build_expert

    cfg = env_config("metaworld_mt2", "env.max_episode_steps=60")
    env = build(cfg, num_envs=4)
    try:
        out = env.reset(seed=0)
        assert env.spec.tasks == ("reach-v3", "drawer-close-v3") * 2
        assert out.obs["task_descriptions"] == ["move the gripper to the goal position", "close the drawer"] * 2
        assert list(env.spec.instructions) == out.obs["task_descriptions"]
        assert {sub.task.env.unwrapped.__class__.__name__ for sub in env.subs[:2]} == \
            {"SawyerReachEnvV3", "SawyerDrawerCloseEnvV3"}
        expert = build_expert(cfg, env)

        class ReachOnly:
            def predict(self, obs, mode="eval"):
                actions = expert(obs)
                actions[1::2] = 0.0  # the drawer-close sub-envs stand still
                return PolicyOutput(actions=actions, logprobs=None, values=None, forward_inputs={})

        result = run_episodes(ReachOnly(), env, num_episodes=8)
        summary = result.summary()
        assert result.tasks == ["reach-v3"] * 2 + ["drawer-close-v3"] * 2 + ["reach-v3"] * 2 + \
            ["drawer-close-v3"] * 2  # sub-env by sub-env
        assert summary["per_task"] == {"reach-v3": 1.0, "drawer-close-v3": 0.0}
        assert summary["per_task_episodes"] == {"reach-v3": 4, "drawer-close-v3": 4}
        low, high = summary["per_task_ci95"]["reach-v3"]  # Wilson's interval of 4 successes in 4
        assert high == pytest.approx(1.0) and low == pytest.approx(0.5101, abs=1e-3)
        assert summary["success_rate"] == 0.5
    finally:
        env.close()


@pytest.mark.parametrize("override, message", [
    ("env.tasks=[reach-v3,reach-v3]", "names a task twice"),
    ("env.tasks=[reach-v3,push-v3,drawer-close-v3]", "must spread evenly over each policy batch"),
    ("env.tasks=[reach-v3,reach-v9]", "env.task='reach-v9' is not a Meta-World task"),
])
def test_env_tasks_are_checked_at_start_up(override, message):
    with pytest.raises(ConfigError, match=message):
        env_config("metaworld_mt2", override)


def test_an_evaluation_takes_tasks_its_run_could_not_split_over_its_batches():
    """scripts/eval.py builds its own env (one sub-env per task): the run's batches need not fit."""
    from hydra import compose, initialize_config_dir

    from embodied_async.config.hydra_schema import register_schema
    from embodied_async.config.validate import to_eval_config, to_train_config

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        raw = compose(config_name="maniskill_async_ppo_mlp", overrides=[
            "env=metaworld_mt2", "runner.logger.log_path=/tmp/unused", "env.tasks=[reach-v3,push-v3,drawer-close-v3]"])
    with pytest.raises(ConfigError, match="must spread evenly over each policy batch"):
        to_train_config(raw)
    assert list(to_eval_config(raw).env.tasks) == ["reach-v3", "push-v3", "drawer-close-v3"]
    raw.env.tasks = ["reach-v3", "reach-v3"]
    with pytest.raises(ConfigError, match="names a task twice"):  # what matters to an evaluation still counts
        to_eval_config(raw)
