"""``gym.make`` of a ManiSkill task for ``ManiSkillEnv``: the keyword arguments its config gives,
download prompts turned into errors, a control mode the robot lacks named by its key, and the
robot's low-poly copy (``env.robot_mesh_fraction`` < 1) swapped in while the scene is built."""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from typing import Any, Dict, Optional

from .tasks import DOWNLOAD_COMMAND, task_robot_class

# ManiSkill's prompt function is a module global; the lock keeps concurrent constructions (the
# "local" cluster backend runs workers as threads) from restoring each other's patch.
_PROMPT_LOCK = threading.Lock()
# The same for the robot's URDF path, a class attribute a low-poly robot copy swaps (_robot_urdf).
_ROBOT_LOCK = threading.RLock()


def gym_kwargs(env_cfg) -> Dict[str, Any]:
    """``gym.make``'s keyword arguments for ``env_cfg`` (``env.extra_kwargs`` last; the sensor
    size is the image size unless they set ``sensor_configs``)."""
    backend = env_cfg.sim_backend
    extra = dict(getattr(env_cfg, "extra_kwargs", None) or {})
    if env_cfg.robot is not None:
        extra["robot_uids"] = env_cfg.robot
    kwargs: Dict[str, Any] = dict(
        obs_mode=env_cfg.obs_mode,
        reward_mode=env_cfg.reward_mode,
        render_mode=None,
        sim_backend=backend,
        render_backend="gpu" if backend == "gpu" else _render_backend(),
    )
    if backend == "cpu":
        # an auto-reset episode then starts from the sub-env's own seeded RNG, not from the
        # process's global torch RNG (which the policy's sampling also draws from): a run's
        # training episodes follow from its seed, and an evaluation reset with one seed
        # replays the same episodes in any process
        kwargs["enhanced_determinism"] = True
    if env_cfg.control_mode:
        kwargs["control_mode"] = env_cfg.control_mode
    if env_cfg.max_episode_steps:
        kwargs["max_episode_steps"] = int(env_cfg.max_episode_steps)
    if env_cfg.render_video:
        height, width = (int(v) for v in env_cfg.video_size)
        kwargs["human_render_camera_configs"] = dict(width=width, height=height)
    if env_cfg.obs_mode != "state":
        height, width = (int(v) for v in env_cfg.image_size)
        sensors = dict(width=width, height=height)
        sensors.update(extra.pop("sensor_configs", None) or {})
        kwargs["sensor_configs"] = sensors
    kwargs.update(extra)
    return kwargs


def make_task_env(gym, task: str, kwargs: Dict[str, Any], num_envs: int, env_cfg, robot_copies: Dict[Any, str]):
    """``gym.make`` of ``task`` with ``num_envs`` scenes, its robot the low-poly copy when
    ``env.robot_mesh_fraction`` < 1 (``robot_copies``: robot class -> its copy's URDF, built once)."""
    agent_cls, robot_copy = None, None
    fraction = float(env_cfg.robot_mesh_fraction)
    if fraction < 1.0:
        from .low_poly import low_poly_urdf

        agent_cls = task_robot_class(task, env_cfg.robot)
        if agent_cls not in robot_copies:
            robot_copies[agent_cls] = str(low_poly_urdf(agent_cls.urdf_path, fraction))
        robot_copy = robot_copies[agent_cls]
    with _refuse_download_prompts(task), _control_mode_named(env_cfg), _robot_urdf(agent_cls, robot_copy):
        env = gym.make(task, num_envs=num_envs, **kwargs)
        _build_robot_from(env.unwrapped, agent_cls, robot_copy)
    return env


@contextlib.contextmanager
def _control_mode_named(env_cfg):
    """ManiSkill asserts on a control mode the robot lacks: say which key and which modes."""
    try:
        yield
    except AssertionError as err:
        if "not in supported modes" not in str(err):
            raise
        robot = env_cfg.robot or "the task's default robot"
        raise ValueError(f"env.control_mode={env_cfg.control_mode!r} is not a control mode of {robot} in ManiSkill "
                         f"task '{env_cfg.task}': {err}. Set env.control_mode to one of them") from None


@contextlib.contextmanager
def _refuse_download_prompts(task_id: str):
    """Turn a download prompt ManiSkill still reaches (robots chosen inside a task's constructor,
    which ``check_task_assets`` cannot see) into an error instead of ``input()`` / ``exit()``."""
    from mani_skill.utils import download_asset

    def refuse(message: str):
        match = re.search(r"Robot (\S+) has assets", message)
        uid = match.group(1) if match else task_id
        raise FileNotFoundError(
            f"ManiSkill task '{task_id}' needs assets that are not downloaded ({message.strip()}). "
            f"Download them with:\n  {DOWNLOAD_COMMAND.format(uid)}"
        )

    with _PROMPT_LOCK:
        original = download_asset.prompt_yes_no
        download_asset.prompt_yes_no = refuse
        try:
            yield
        finally:
            download_asset.prompt_yes_no = original


@contextlib.contextmanager
def _robot_urdf(agent_cls, urdf_path: Optional[str]):
    """ManiSkill reads the robot's URDF from its agent class when it builds a scene: point the
    class at ``urdf_path`` (None: leave it) for as long as the scene is built."""
    with _ROBOT_LOCK:  # the attribute is shared by every env of this process: build one at a time
        if urdf_path is None:
            yield
            return
        original = agent_cls.urdf_path
        agent_cls.urdf_path = urdf_path
        try:
            yield
        finally:
            agent_cls.urdf_path = original


def _build_robot_from(base, agent_cls, urdf_path: Optional[str]) -> None:
    """Later scene rebuilds (a reset with reconfiguration) load the same robot copy."""
    if urdf_path is None:
        return
    load_agent = base._load_agent

    def load_agent_from_copy(*args, **kwargs):
        with _robot_urdf(agent_cls, urdf_path):
            return load_agent(*args, **kwargs)

    base._load_agent = load_agent_from_copy


@functools.lru_cache(maxsize=1)
def _render_backend() -> str:
    """"gpu" when SAPIEN sees a CUDA device, else "cpu" (saves ManiSkill's fall-back warning)."""
    import sapien

    try:
        sapien.Device("cuda")
        return "gpu"
    except RuntimeError:
        return "cpu"
