"""LIBERO's side, run in the child process under ``.venv-libero`` (``embodied_async.isolated``):
one task's simulator behind the ``SubEnv`` contract, and what the start-up checks ask."""

from __future__ import annotations

import functools
import os
from typing import Dict, Optional

import numpy as np

from embodied_async.contracts import SubStep

CAMERAS = ("agentview", "robot0_eye_in_hand", "frontview", "birdview", "sideview")
NO_OP = [0.0] * 6 + [-1.0]  # no motion, the gripper open: what LIBERO's scripts send while objects settle


def _benchmark():
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero.libero import benchmark

    return benchmark.get_benchmark_dict()


def describe(config) -> Dict[str, object]:
    """The suites, the tasks of ``config["suite"]`` (empty when it is none), the cameras and the
    number of official initial states of each task."""
    suites = _benchmark()
    suite = suites[config["suite"]]() if config["suite"] in suites else None
    tasks = list(suite.get_task_names()) if suite else []
    init_states = {task: len(suite.get_task_init_states(i)) for i, task in enumerate(tasks)}
    return {"suites": sorted(suites), "tasks": tasks, "cameras": list(CAMERAS), "init_states": init_states}


def proprio(obs) -> np.ndarray:
    """The robot's state as LIBERO's datasets and policies read it: end-effector position (3),
    orientation as an axis-angle (3), the gripper's two finger positions (2)."""
    quat = np.asarray(obs["robot0_eef_quat"], dtype=np.float64)  # x, y, z, w
    w = np.clip(quat[3], -1.0, 1.0)
    sine = np.sqrt(max(1.0 - w * w, 0.0))
    axis_angle = quat[:3] * (2.0 * np.arccos(w) / sine) if sine > 1e-8 else np.zeros(3)
    return np.concatenate([obs["robot0_eef_pos"], axis_angle, obs["robot0_gripper_qpos"]]).astype(np.float32)


def upright(image: np.ndarray) -> np.ndarray:
    """LIBERO renders upside down (OpenGL's origin): turned by 180 degrees, as OpenVLA's and openpi's
    LIBERO evaluations and datasets have it."""
    return np.ascontiguousarray(image[::-1, ::-1])


def resized(image: np.ndarray, size) -> np.ndarray:
    """``image`` at ``size`` ([height, width]) by the nearest pixel (a video frame: no filter needed)."""
    height, width = int(size[0]), int(size[1])
    if image.shape[:2] == (height, width):
        return image
    rows = (np.arange(height) * image.shape[0] // height).clip(0, image.shape[0] - 1)
    columns = (np.arange(width) * image.shape[1] // width).clip(0, image.shape[1] - 1)
    return np.ascontiguousarray(image[rows][:, columns])


class LiberoSubEnv:
    """One task of a suite, started from the task's official initial states (50 of them), as the
    published evaluations do. Sub-env ``place`` of the ``count`` sub-envs running this task takes
    states ``place``, ``place + count``, ``place + 2 count``, ... (modulo their number), so the
    task's sub-envs together go through the states in order; a seeded reset starts from state
    ``seed`` and goes on from there the same way (one seed, one state: grouped resets compare
    episodes from the same one). ``init_state`` set: every episode starts from that state."""

    def __init__(self, config):
        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        suite = _benchmark()[config["suite"]]()
        index = suite.get_task_names().index(config["task"])
        task = suite.get_task(index)
        self.instruction = task.language
        self.init_states = suite.get_task_init_states(index)
        self.cameras = {key: name for key, name in config["cameras"].items() if name}
        self.step_limit, self.settle_steps = int(config["step_limit"]), int(config["settle_steps"])
        self.privileged, self.video = bool(config["privileged_states"]), bool(config["render_video"])
        self.video_size = [int(v) for v in config["video_size"]]
        height, width = config["image_size"]
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        self.env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=height, camera_widths=width,
                                      camera_names=sorted(set(self.cameras.values())))
        self.gripper_open_one = config["gripper"] == "open_one"
        fraction = float(config["mesh_fraction"])
        if fraction < 1.0:  # LIBERO rebuilds the scene from its XML at each reset: reduced from the first on
            from envs.libero.low_poly_scene import low_poly_xml

            self.env.env.set_xml_processor(functools.partial(low_poly_xml, fraction=fraction))
        self.reflections = bool(config["reflections"])
        self.fixed_state = config["init_state"]
        self.next_state, self.stride = int(config["place"]), int(config["count"])
        self.steps, self.obs = 0, None

    def reset(self, seed: Optional[int] = None) -> None:
        if seed is not None:
            self.next_state = int(seed)
        index = (self.next_state if self.fixed_state is None else int(self.fixed_state)) % len(self.init_states)
        self.next_state += self.stride
        self.env.reset()  # LIBERO rebuilds the simulator (and its renderer) at each reset
        if not self.reflections:
            self._turn_off_reflections()
        self.obs = self.env.set_init_state(self.init_states[index])
        for _ in range(self.settle_steps):
            self.obs, _, _, _ = self.env.step(NO_OP)
        self.steps = 0

    def _turn_off_reflections(self) -> None:
        import mujoco

        context = self.env.env.sim._render_context_offscreen
        if context is not None:
            context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def step(self, action: np.ndarray) -> SubStep:
        action = np.asarray(action, dtype=np.float64)
        if self.gripper_open_one:  # 1 open, 0 closed -> LIBERO's -1 open, +1 closed
            action = np.concatenate([action[:-1], [-1.0 if action[-1] > 0.5 else 1.0]])
        self.obs, _, done, _ = self.env.step(action.tolist())
        self.steps += 1
        success = bool(done or self.env.check_success())
        return SubStep(reward=float(success), success=success, terminated=success,
                       truncated=not success and self.steps >= self.step_limit)

    def observe(self) -> Dict[str, np.ndarray]:
        obs = {key: upright(self.obs[f"{name}_image"])[None] for key, name in self.cameras.items()}
        obs["states"] = proprio(self.obs)[None]
        if self.privileged:
            obs["privileged_states"] = np.concatenate(
                [self.obs["object-state"], self.obs["robot0_proprio-state"]]).astype(np.float32)[None]
        if self.video:  # the agent view at env.video_size
            obs["video_frames"] = resized(obs["main_images"][0], self.video_size)[None]
        return obs

    def close(self) -> None:
        self.env.close()


def build_sub_env(config) -> LiberoSubEnv:
    return LiberoSubEnv(config)
