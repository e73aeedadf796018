"""Configs of the MuJoCo env families: robosuite (``env.name: robosuite``), Meta-World
(``metaworld``) and gymnasium-robotics' Fetch tasks (``fetch``). Every key and its default.

All three share the keys of ``MujocoConfig`` and one batched env (``envs/mujoco/mujoco_env.py``);
each names its simulator package's task, cameras and (robosuite) robot and controller. Start-up
checks read the package's own registries and fail listing the valid names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional, Tuple

from omegaconf import MISSING

from embodied_async.config.checks import ConfigError, bound, choice, require
from embodied_async.config.schema import EnvConfig

OBS_MODES = ("state", "rgb")
NO_CAMERA = "none"


@dataclass
class MujocoConfig(EnvConfig):
    """What every MuJoCo family has."""

    task: str = MISSING
    # "state": proprioception + the task's object/goal state; "rgb": camera images + proprioception
    obs_mode: str = "state"
    image_size: List[int] = field(default_factory=lambda: [128, 128])  # [height, width]
    # camera names of the task's model; null: the family's default; "none": no such image
    main_camera: Optional[str] = None
    wrist_camera: Optional[str] = None
    max_episode_steps: int = 100  # the time limit (truncation) in control steps
    # natural-language instruction; null: the family's table entry for the task, else its name's words
    instruction: Optional[str] = None
    # removed: algorithm.reward_scale is the one reward scale (the two multiplied each other); a
    # value here is refused naming it, until the next release
    reward_scale: Optional[float] = None

    builder: ClassVar[str] = "envs.mujoco.mujoco_env:MujocoEnv"
    task_key: ClassVar[Optional[str]] = "task"  # env.tasks: several tasks of the family (Meta-World MT10)
    supports_privileged_states: ClassVar[bool] = True  # every family's full state (Task.state)
    can_run_past_success: ClassVar[bool] = True  # env.end_on_success=false runs to the time limit
    # the module holding the family's task class (``Task``: one simulator) and its name checks
    task_module: ClassVar[str] = ""

    def observes_states(self) -> bool:
        return self.obs_mode == "state"

    def check(self) -> None:
        choice(self.obs_mode, "env.obs_mode", OBS_MODES)
        image_size = list(self.image_size)
        require(len(image_size) == 2 and all(int(v) >= 8 for v in image_size),
                f"env.image_size={image_size} must be [height, width], each >= 8; use e.g. [128, 128]")
        bound(self.max_episode_steps, "env.max_episode_steps", lambda v: v >= 1, "must be >= 1", "use e.g. 100")
        require(self.reward_scale is None, f"env.reward_scale={self.reward_scale} was removed: set "
                f"algorithm.reward_scale={self.reward_scale}, the one reward scale (the two multiplied each other)")
        try:
            self.task_class().check_names(self)  # imports the simulator package (seconds)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def check_video(self) -> None:
        """Every MuJoCo family renders videos from its main camera."""
        require(self.main_camera != NO_CAMERA, "videos are drawn from env.main_camera, which is 'none': name a "
                                               "camera (or null for the task's default)")

    def task_class(self):
        import importlib

        return importlib.import_module(self.task_module).Task


@dataclass
class RobosuiteConfig(MujocoConfig):
    """A robosuite manipulation task (https://robosuite.ai) with a robot and controller by name."""

    name: str = "robosuite"
    robot: str = "Panda"  # one of robosuite.ALL_ROBOTS that loads in the task
    # the arm's part controller (robosuite.controllers.ALL_PART_CONTROLLERS), e.g. OSC_POSITION
    # (3 values + gripper), OSC_POSE (6 + gripper), JOINT_VELOCITY; null: the robot's default
    controller: Optional[str] = "OSC_POSITION"
    control_freq: int = 20  # control steps per simulated second
    # MuJoCo's step in seconds; null: robosuite's 0.002. Each control step runs
    # 1 / (control_freq x sim_timestep) physics steps, each with the controller in Python, so a
    # coarser step is faster (0.005: ~2x), but grippers can go unstable under random actions
    # (UR5e's Robotiq at 0.005 did): an unstable step ends the episode as a failure
    sim_timestep: Optional[float] = None
    reward_shaping: bool = True  # the task's dense staged reward (false: success only)

    task_module: ClassVar[str] = "envs.mujoco.robosuite_tasks"
    robot_key: ClassVar[Optional[str]] = "robot"
    control_keys: ClassVar[Tuple[str, ...]] = ("controller",)

    def check(self) -> None:
        bound(self.control_freq, "env.control_freq", lambda v: 1 <= v <= 500, "must be within 1-500",
              "use e.g. 20")
        bound(self.sim_timestep, "env.sim_timestep", lambda v: 0 < v <= 1 / self.control_freq,
              "must be > 0 and at most one control step (1 / env.control_freq)", "use e.g. 0.002",
              null="for robosuite's 0.002")
        super().check()


@dataclass
class MetaWorldConfig(MujocoConfig):
    """A Meta-World task (Sawyer arm), e.g. reach-v3; its episodes last at most 500 steps."""

    name: str = "metaworld"

    task_module: ClassVar[str] = "envs.mujoco.metaworld_tasks"
    # Meta-World's own scripted policy of the task (metaworld.policies)
    scripted_expert: ClassVar[Optional[str]] = "envs.mujoco.metaworld_tasks:build_expert"

    def check(self) -> None:
        bound(self.max_episode_steps, "env.max_episode_steps", lambda v: 1 <= v <= 500, "must be within 1-500",
              "Meta-World ends every episode at 500 steps: use e.g. 150")
        super().check()


@dataclass
class FetchConfig(MujocoConfig):
    """A gymnasium-robotics Fetch task by its gymnasium id, e.g. FetchReachDense-v4."""

    name: str = "fetch"

    task_module: ClassVar[str] = "envs.mujoco.fetch_tasks"
