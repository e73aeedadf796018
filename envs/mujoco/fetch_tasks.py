"""gymnasium-robotics' Fetch tasks (e.g. ``FetchReachDense-v4``) as sub-envs of ``MujocoEnv``
(``env.name: fetch``). The goal is part of the state; success is ``info["is_success"]``."""

from __future__ import annotations

import difflib
import re
from typing import Tuple

import numpy as np

from .configuration_mujoco import NO_CAMERA, FetchConfig
from .gym_task import GymTask

INSTRUCTIONS = {
    "FetchReach": "move the gripper to the red target",
    "FetchPush": "push the block to the red target",
    "FetchSlide": "slide the puck to the red target",
    "FetchPickAndPlace": "pick up the block and move it to the red target",
}
# the gripper camera of the model sees only the inside of the gripper: no wrist image
CAMERAS = ("external_camera_0", "head_camera_rgb")


def _registered_tasks():
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return sorted(k for k in gym.registry if k.startswith("Fetch"))


class Task(GymTask):
    def __init__(self, cfg: FetchConfig, seed: int):
        import gymnasium as gym

        _registered_tasks()
        # no gymnasium time limit: MujocoEnv applies env.max_episode_steps
        super().__init__(gym.make(cfg.task, max_episode_steps=10**9), seed)
        base = re.sub(r"(Dense)?-v\d+$", "", cfg.task)
        self.instruction = INSTRUCTIONS.get(base) or " ".join(w.lower() for w in re.findall(r"[A-Z][a-z]*", base))
        self.default_cameras = ("external_camera_0", None)

    def reset(self) -> None:
        self._obs, _ = self.env.reset(seed=self._take_seed())
        # gymnasium-robotics moves the goal marker only when its own render() runs: place it
        # for our renderer too, or images would show the marker at its default position
        self.env.unwrapped._render_callback()

    def step(self, action) -> Tuple[float, bool, bool]:
        self._obs, reward, _, _, info = self.env.step(action)
        return float(reward), bool(info["is_success"] > 0.5), False

    def state(self, full: bool) -> np.ndarray:
        robot = np.asarray(self._obs["observation"], dtype=np.float32)
        if full:
            return np.concatenate([robot, np.asarray(self._obs["desired_goal"], dtype=np.float32)])
        # the gripper's position and finger opening (Reach's observation has no object part)
        return robot[:5] if robot.shape[0] == 10 else robot[[0, 1, 2, 9, 10]]

    @classmethod
    def check_names(cls, cfg: FetchConfig) -> None:
        tasks = _registered_tasks()
        if cfg.task not in tasks:
            close = difflib.get_close_matches(cfg.task, tasks, n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ValueError(f"env.task={cfg.task!r} is not a Fetch task{hint}; "
                             f"gymnasium-robotics ships: {', '.join(tasks)}")
        for key, name in (("env.main_camera", cfg.main_camera), ("env.wrist_camera", cfg.wrist_camera)):
            if name not in (None, NO_CAMERA) and name not in CAMERAS:
                raise ValueError(f"{key}={name!r} is not a usable Fetch camera; its cameras: {', '.join(CAMERAS)} "
                                 "(or 'none')")
