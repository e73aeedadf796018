"""Config of the ManiSkill env family (``env.name: maniskill``): every key and its default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from omegaconf import MISSING

from embodied_async.config.checks import ConfigError, bound, choice, require
from embodied_async.config.schema import EnvConfig

from . import tasks as task_checks
from .tasks import OBS_MODES

SIM_BACKENDS = ("cpu", "gpu")
GPU_SIM_BASE_BYTES = 2 * 2**30  # PhysX GPU buffers + SAPIEN's render system, one env process


@dataclass
class ManiSkillConfig(EnvConfig):
    """A ManiSkill3 task (https://maniskill.readthedocs.io): observations, control and simulator."""

    name: str = "maniskill"
    task: str = MISSING  # a ManiSkill task id, e.g. PushCube-v1
    obs_mode: str = "state"  # one of OBS_MODES: "state", "rgb" or "rgb+segmentation"
    control_mode: Optional[str] = "pd_joint_delta_pos"  # null: the task's own default
    sim_backend: str = "cpu"  # "cpu": one scene per sub-env, stepped in turn; "gpu": batched
    max_episode_steps: int = 50  # 0: the task's own limit
    reward_mode: str = "normalized_dense"  # the task's own reward (ManiSkill's reward_mode)
    # a named reward computed from the task's info instead (envs/maniskill/rewards.py), e.g.
    # "grasp_place" for the Bridge twins, which pay none; null: the task's reward
    reward: Optional[str] = None
    reward_weights: Dict[str, float] = field(default_factory=dict)  # overrides of its weights
    image_size: List[int] = field(default_factory=lambda: [128, 128])  # [height, width]
    # natural-language instruction; None: the task's own, else words derived from the task id
    instruction: Optional[str] = None
    # the robot, for tasks that accept several (the task's SUPPORTED_ROBOTS, e.g. PickCube-v1:
    # panda, fetch, xarm6_robotiq, so100, widowxai); null: the task's default
    robot: Optional[str] = None
    # the sensors giving main_images / wrist_images in rgb mode; null: the first camera not on the
    # hand / the hand camera, if any
    main_camera: Optional[str] = None
    wrist_camera: Optional[str] = None
    # the fraction of its visual meshes' triangles the robot keeps in camera images: below 1 a
    # reduced copy of the robot is built once (cached) and rendered instead. On a CPU the Panda's
    # full meshes are most of a frame's cost (~27 of ~32 ms at 64x64); 0.05 looks the same at
    # VLA image sizes and renders ~5x faster (envs/maniskill/low_poly.py). Physics is unchanged.
    robot_mesh_fraction: float = 1.0
    # extra keyword arguments for the simulator's constructor (gym.make)
    extra_kwargs: Dict[str, Any] = field(default_factory=dict)
    # the former names of task and robot: they still work until the next release, with a warning
    task_id: Optional[str] = None
    robot_uids: Optional[str] = None

    task_key: ClassVar[Optional[str]] = "task"  # env.tasks: several ManiSkill tasks (CPU backend)
    robot_key: ClassVar[Optional[str]] = "robot"
    renamed_keys: ClassVar[Dict[str, str]] = {"task_id": "task", "robot_uids": "robot"}
    control_keys: ClassVar[Tuple[str, ...]] = ("control_mode",)
    builder: ClassVar[str] = "envs.maniskill.maniskill_env:ManiSkillEnv"
    supports_privileged_states: ClassVar[bool] = True  # the CPU backend's sub-envs (check())
    # our closed-loop controllers of a few tasks (envs/maniskill/scripted.py: SUPPORTED lists them)
    scripted_expert: ClassVar[Optional[str]] = "envs.maniskill.scripted:build_expert"

    def observes_states(self) -> bool:
        return self.obs_mode == "state"

    def simulates_on_gpu(self) -> bool:
        return self.sim_backend == "gpu"

    def check(self) -> None:
        choice(self.obs_mode, "env.obs_mode", OBS_MODES)
        choice(self.sim_backend, "env.sim_backend", SIM_BACKENDS)
        bound(self.max_episode_steps, "env.max_episode_steps", lambda v: v >= 0, "must be >= 0",
              "use 0 for the task's own limit")
        bound(self.robot_mesh_fraction, "env.robot_mesh_fraction", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]",
              "use 1.0 for the robot's own meshes, e.g. 0.05 for a cheap CPU render")
        image_size = list(self.image_size)
        require(len(image_size) == 2 and all(v > 0 for v in image_size),
                f"env.image_size={image_size} must be [height, width] with two positive integers; use e.g. [128, 128]")
        # the GPU vector env resets a finished sub-env before its last state could be read
        require(not self.privileged_states or self.sim_backend == "cpu",
                "env.privileged_states=true needs env.sim_backend=cpu (the GPU vector env resets finished sub-envs "
                "before their final state can be read): set env.sim_backend=cpu")
        require(self.reward is not None or not self.reward_weights,
                f"env.reward_weights={dict(self.reward_weights)} is set, but env.reward is null: name the reward "
                "they weigh (e.g. env.reward=grasp_place) or drop env.reward_weights")
        if self.reward is not None:
            from envs.maniskill.rewards import REWARDS

            choice(self.reward, "env.reward", tuple(REWARDS))
            REWARDS[self.reward](1, dict(self.reward_weights))  # unknown weight names fail here
            dense = REWARDS[self.reward].DENSE_MODES
            require(dense is None or self.reward_mode in dense,
                    f"env.reward={self.reward!r} builds on the task's dense reward, but env.reward_mode="
                    f"{self.reward_mode!r}: set env.reward_mode to one of {list(dense or ())}")
        self._check_task()  # last: it imports ManiSkill (seconds)

    def check_video(self) -> None:
        # the GPU vector env resets finished sub-envs inside its step: their last frame is gone
        require(self.sim_backend == "cpu", "runner.eval_video=true needs env.sim_backend=cpu for ManiSkill (the GPU "
                                           "vector env resets finished sub-envs before their last frame can be "
                                           "rendered); set runner.eval_video=false or env.sim_backend=cpu")

    def memory_estimate(self, workload):
        """GPU simulation: PhysX buffers and the renderer per process, and the camera targets per
        sub-env (RGBA, depth, segmentation at 4 bytes each). Assumed, not measured here."""
        if self.sim_backend != "gpu":
            return None
        height, width = (int(v) for v in self.image_size)
        cameras = 0 if self.obs_mode == "state" else workload.envs_per_process * height * width * 12
        return {"simulator + renderer": GPU_SIM_BASE_BYTES, "camera buffers": cameras}

    def memory_notes(self):
        if self.sim_backend != "gpu":
            return []
        return [f"ManiSkill GPU simulation assumed at {GPU_SIM_BASE_BYTES / 2**30:.1f} GiB per env process "
                "plus camera buffers (not measured: scripts/gpu_check.py measures PushCube)"]

    def _check_task(self) -> None:
        """The task exists and supports the configured modes. Missing assets are not a config
        error: the env worker reports them with the download command, and a machine that only
        validates configs need not hold them."""
        try:
            task_checks.check_task_assets(self.task, self.robot)
        except FileNotFoundError:
            pass
        except ValueError as err:
            raise ConfigError(f"{err}. Set env.task to a ManiSkill task (check the spelling and the -v<N> "
                              "version suffix)") from None
        try:
            task_checks.check_task_modes(self.task, self.obs_mode, self.reward_mode)
            task_checks.check_task_robot(self.task, self.robot)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        require(self.robot is None or "robot_uids" not in self.extra_kwargs,
                "env.robot and env.extra_kwargs.robot_uids are both set: keep env.robot")
