"""robosuite tasks as sub-envs of ``MujocoEnv`` (``env.name: robosuite``), plus ``Reach``
(``robosuite_reach``): move the gripper to a target drawn above the table, for any robosuite robot
(robosuite has no reaching task; it is the quickest to learn on a CPU).

robosuite draws object placements and joint noise from numpy's global generator; each sub-env
keeps its own generator state and swaps it in around its resets, so sub-envs in one process
draw independent, seeded streams.
"""

from __future__ import annotations

import contextlib
import difflib
from typing import Tuple

import numpy as np

from .configuration_mujoco import NO_CAMERA, RobosuiteConfig

INSTRUCTIONS = {
    "Reach": "move the gripper to the red target",
    "Lift": "pick up the red cube",
    "Stack": "stack the red cube on top of the green cube",
    "Door": "open the door",
    "NutAssembly": "put the square nut on the square peg and the round nut on the round peg",
    "NutAssemblySquare": "put the square nut on the square peg",
    "NutAssemblyRound": "put the round nut on the round peg",
    "NutAssemblySingle": "put the nut on its peg",
    "PickPlace": "put each object into its bin",
    "PickPlaceSingle": "put the object into its bin",
    "PickPlaceCan": "put the can into its bin",
    "PickPlaceMilk": "put the milk carton into its bin",
    "PickPlaceBread": "put the bread into its bin",
    "PickPlaceCereal": "put the cereal box into its bin",
    "Wipe": "wipe the markings off the table",
    "ToolHang": "hang the tool on the stand",
}
SINGLE_ARM_ROBOTS_HINT = "Panda, UR5e, IIWA, Kinova3, Jaco"


def _register_reach() -> None:
    """The Reach task, registered with robosuite (its environments register when defined: on the
    first import of ``robosuite_reach``)."""
    from . import robosuite_reach  # noqa: F401


@contextlib.contextmanager
def _sim_timestep(seconds):
    """robosuite reads MuJoCo's timestep from a module setting when it builds a model."""
    from robosuite import macros

    default = macros.SIMULATION_TIMESTEP
    macros.SIMULATION_TIMESTEP = seconds or default
    try:
        yield
    finally:
        macros.SIMULATION_TIMESTEP = default


def _controller_config(robot: str, controller):
    from robosuite.controllers import load_composite_controller_config, load_part_controller_config

    config = load_composite_controller_config(robot=robot)
    if controller is not None:
        arm = load_part_controller_config(default_controller=controller)
        arm["gripper"] = {"type": "GRIP"}
        for part in ("right", "left"):  # single-arm robots name their arm "right"
            if part in config.get("body_parts", {}):
                config["body_parts"][part] = dict(arm)
    return config


class Task:
    reports_fail = False
    upside_down_cameras = frozenset()  # MuJoCo's renderer draws robosuite's cameras upright

    def __init__(self, cfg: RobosuiteConfig, seed: int):
        import robosuite

        _register_reach()
        self.cfg = cfg
        self._rng_state = np.random.RandomState(seed).get_state()
        with self._own_rng(), _sim_timestep(cfg.sim_timestep):
            self.env = robosuite.make(
                cfg.task, robots=cfg.robot, controller_configs=_controller_config(cfg.robot, cfg.controller),
                has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
                reward_shaping=cfg.reward_shaping, control_freq=cfg.control_freq,
                horizon=10**9, ignore_done=True, hard_reset=False)  # the time limit is MujocoEnv's
        self.action_low, self.action_high = (np.asarray(v, dtype=np.float32) for v in self.env.action_spec)
        self.instruction = INSTRUCTIONS.get(cfg.task) or _words(cfg.task)
        self.control_hz = float(cfg.control_freq)
        self.camera_names = list(self.env.sim.model.camera_names)
        wrist = "robot0_eye_in_hand" if "robot0_eye_in_hand" in self.camera_names else None
        self.default_cameras = ("agentview" if "agentview" in self.camera_names else self.camera_names[0], wrist)
        self._obs = None

    @property
    def mj_model(self):
        return self.env.sim.model._model

    @property
    def mj_data(self):
        return self.env.sim.data._data

    def seed(self, seed: int) -> None:
        self._rng_state = np.random.RandomState(seed).get_state()

    @contextlib.contextmanager
    def _own_rng(self):
        """numpy's global generator holds this sub-env's state for the duration."""
        outer = np.random.get_state()
        np.random.set_state(self._rng_state)
        try:
            yield
        finally:
            self._rng_state = np.random.get_state()
            np.random.set_state(outer)

    def reset(self) -> None:
        with self._own_rng():
            self._obs = self.env.reset()

    def step(self, action) -> Tuple[float, bool, bool]:
        self._obs, reward, _, _ = self.env.step(action)
        return float(reward), bool(self.env._check_success()), False

    def state(self, full: bool) -> np.ndarray:
        keys = sorted(k for k in self._obs if k.endswith("proprio-state"))
        if full and "object-state" in self._obs:
            keys.append("object-state")
        return np.concatenate([np.asarray(self._obs[k], dtype=np.float32).reshape(-1) for k in keys])

    def close(self) -> None:
        self.env.close()

    @classmethod
    def check_names(cls, cfg: RobosuiteConfig) -> None:
        import robosuite
        from robosuite.controllers import ALL_PART_CONTROLLERS

        _register_reach()
        tasks = sorted(robosuite.ALL_ENVIRONMENTS)
        if cfg.task not in tasks:
            close = difflib.get_close_matches(cfg.task, tasks, n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ValueError(f"env.task={cfg.task!r} is not a robosuite task{hint}; "
                             f"robosuite {robosuite.__version__} ships: {', '.join(tasks)}")
        robots = sorted(robosuite.ALL_ROBOTS)
        if cfg.robot not in robots:
            raise ValueError(f"env.robot={cfg.robot!r} is not a robosuite robot; robosuite {robosuite.__version__} "
                             f"ships: {', '.join(robots)} (single-arm ones that load in the table tasks: "
                             f"{SINGLE_ARM_ROBOTS_HINT})")
        controllers = sorted(ALL_PART_CONTROLLERS)
        if cfg.controller is not None and cfg.controller not in controllers:
            raise ValueError(f"env.controller={cfg.controller!r} is not a robosuite arm controller; use one of: "
                             f"{', '.join(controllers)} (or null for the robot's default)")
        named = [c for c in (cfg.main_camera, cfg.wrist_camera) if c not in (None, NO_CAMERA)]
        if named:  # the cameras live in the task's model: build it once, without a renderer
            sub = cls(cfg, 0)
            try:
                missing = [c for c in named if c not in sub.camera_names]
            finally:
                sub.close()
            if missing:
                raise ValueError(f"camera {missing[0]!r} (env.main_camera / env.wrist_camera) is not in robosuite task "
                                 f"'{cfg.task}' with {cfg.robot}; its cameras: {', '.join(sub.camera_names)} "
                                 "(or 'none')")


def _words(name: str) -> str:
    import re

    return " ".join(w.lower() for w in re.findall(r"[A-Z][a-z]*|\d+", name)) or name
