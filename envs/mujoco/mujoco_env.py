"""MuJoCo tasks (robosuite, Meta-World, Fetch) behind the batched env contract.

``MujocoEnv`` is a ``SerialEnv`` (``embodied_async/serial_env.py``: action chunks, auto-reset,
final observations) over ``B`` simulators of one task, one ``MujocoSubEnv`` per sub-env, which
applies the time limit (``env.max_episode_steps``), ends an episode at success when
``env.end_on_success`` and renders camera images with MuJoCo's own renderer on EGL.

A family supplies its task class (``envs/mujoco/<family>_tasks.py``), one simulator with:

- ``instruction``, ``action_low``/``action_high``, ``control_hz`` (actions per simulated second),
  ``camera_names``, ``default_cameras``
  (main, wrist or None), ``upside_down_cameras`` (turned by 180 degrees when drawn),
  ``reports_fail``, ``mj_model``/``mj_data`` (what the renderer draws);
- ``seed(seed)`` (for the next reset), ``reset()``, ``step(action) -> (reward, success, fail)``,
  ``state(full)`` (float32: the
  proprioception, plus the task's object and goal state when ``full``), ``close()``;
- ``check_names(cfg)`` (class method): ``ValueError`` listing the valid task, robot, controller
  or camera names.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Optional

import numpy as np

from embodied_async.contracts import EnvSpec, SubStep
from embodied_async.data import Observation
from embodied_async.evaluation import VIDEO_KEY
from embodied_async.serial_env import SerialEnv

from .configuration_mujoco import NO_CAMERA, MujocoConfig

GL_HELP = ("MuJoCo could not render with MUJOCO_GL={gl} ({error}). Rendering on a machine without a display "
           "needs EGL: on Debian/Ubuntu run  sudo apt-get install -y libegl1 libgl1 libgles2 libegl-mesa0 "
           "libgl1-mesa-dri  (scripts/setup.sh does); MUJOCO_GL must be set before mujoco is first imported "
           "(envs.mujoco sets egl unless it is set already). Or use env.obs_mode=state without runner.eval_video")


class Renderer:
    """Named cameras of one simulator at fixed sizes. An EGL context is current in one thread
    only, and Ray runs an actor's methods on other threads than its constructor: each thread
    gets its own renderer (one per size)."""

    def __init__(self, model):
        # no anti-aliasing samples and small shadow maps: ~8x cheaper frames on a CPU renderer
        model.vis.quality.offsamples = 0
        model.vis.quality.shadowsize = min(int(model.vis.quality.shadowsize), 1024)
        self.model = model
        self._renderers: Dict[tuple, object] = {}

    def render(self, data, camera: str, height: int, width: int, upside_down: bool = False) -> np.ndarray:
        key = (threading.get_ident(), height, width)
        if key not in self._renderers:
            self._renderers[key] = self._make(height, width)
        renderer = self._renderers[key]
        try:
            renderer.update_scene(data, camera=camera)
            image = renderer.render()
        except Exception as err:  # EGL errors hold ctypes pointers, which cannot cross processes
            raise RuntimeError(f"MuJoCo rendering of camera {camera!r} failed: {type(err).__name__}: {err}") from None
        return np.ascontiguousarray(image[::-1, ::-1]) if upside_down else image.copy()

    def _make(self, height: int, width: int):
        import mujoco

        self.model.vis.global_.offheight = max(int(self.model.vis.global_.offheight), height)
        self.model.vis.global_.offwidth = max(int(self.model.vis.global_.offwidth), width)
        try:
            return mujoco.Renderer(self.model, height, width)
        except Exception as err:  # no EGL library, no device
            raise RuntimeError(GL_HELP.format(gl=os.environ.get("MUJOCO_GL"), error=err)) from None

    def close(self) -> None:
        for renderer in self._renderers.values():
            try:  # a context current in another thread is destroyed once that thread lets it go
                renderer.close()
            except Exception:
                pass
        self._renderers = {}


class MujocoSubEnv:
    """One simulator of a MuJoCo task as a ``contracts.SubEnv``: the task's step, its time limit
    (``env.max_episode_steps``), the end at success (``env.end_on_success``), MuJoCo's unstable
    steps ended as failures, and the observation with its camera images."""

    def __init__(self, task, cfg: MujocoConfig, cameras: Dict[str, Optional[str]], on_unstable):
        self.task, self.cfg, self.cameras = task, cfg, cameras
        self.instruction = cfg.instruction or task.instruction
        self.renderer = Renderer(task.mj_model)
        self.steps = 0
        self._unstable_count = 0
        self._on_unstable = on_unstable

    def reset(self, seed: Optional[int] = None) -> None:
        if seed is not None:
            self.task.seed(int(seed))
        self.task.reset()
        self._unstable_count = self._warning_count()  # a reset may clear it
        self.steps = 0

    def step(self, action: np.ndarray) -> SubStep:
        before = float(self.task.mj_data.time)
        reward, success, fail = self.task.step(action)
        if self._went_unstable(before):  # MuJoCo reset the state mid-episode: a failure
            reward, success, fail = 0.0, False, True
            self._on_unstable()
        self.steps += 1
        return SubStep(reward=float(reward), success=bool(success),
                       terminated=bool(fail) or (bool(success) and self.cfg.end_on_success),
                       truncated=self.steps >= self.cfg.max_episode_steps, fail=bool(fail))

    def _warning_count(self) -> int:
        import mujoco

        return int(self.task.mj_data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number)

    def _went_unstable(self, time_before: float) -> bool:
        """Whether the last step hit MuJoCo's bad-acceleration warning. MuJoCo then resets the
        data (time back to 0, the warning count cleared and then counted once), so the observed
        transition is not physics: seen as a changed count or as time going backwards."""
        count = self._warning_count()
        previous, self._unstable_count = self._unstable_count, count
        return count != previous or float(self.task.mj_data.time) < time_before

    def observe(self) -> Observation:
        task, cfg = self.task, self.cfg
        row: Observation = {"states": task.state(full=cfg.obs_mode == "state")[None].astype(np.float32)}
        if cfg.privileged_states:  # the state mode's vector, whatever this env's obs mode
            row["privileged_states"] = task.state(full=True)[None].astype(np.float32)
        if cfg.obs_mode == "rgb":
            height, width = (int(v) for v in cfg.image_size)
            for key, camera in self.cameras.items():
                if camera is not None:
                    row[key] = self._render(camera, height, width)[None]
        if cfg.render_video:
            height, width = (int(v) for v in cfg.video_size)
            row[VIDEO_KEY] = self._render(self.cameras["main_images"], height, width)[None]
        return row

    def _render(self, camera: str, height: int, width: int) -> np.ndarray:
        task = self.task
        return self.renderer.render(task.mj_data, camera, height, width, camera in task.upside_down_cameras)

    def close(self) -> None:
        self.renderer.close()
        self.task.close()


class MujocoEnv(SerialEnv):
    """``num_envs`` simulators of one MuJoCo task, stepped with action chunks ``[B, C, A]``."""

    def __init__(self, env_cfg: MujocoConfig, num_envs: int, seed: int = 0):
        self.cfg = env_cfg
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        configs = env_cfg.task_configs(int(num_envs))  # one per sub-env, each naming its task
        for each in {c.task: c for c in configs}.values():
            each.task_class().check_names(each)
        tasks = [c.task_class()(c, seed + i) for i, c in enumerate(configs)]
        first = tasks[0]
        for task, c in zip(tasks, configs):
            if not (np.array_equal(task.action_low, first.action_low) and
                    np.array_equal(task.action_high, first.action_high)):
                raise ValueError(f"env.tasks: task '{c.task}' acts in other bounds than '{configs[0].task}' (the "
                                 "tasks of a run share one action space)")
        self._warned_unstable = False
        subs = [MujocoSubEnv(task, c, self._choose_cameras(task, c), self._warn_unstable)
                for task, c in zip(tasks, configs)]
        super().__init__(subs, first.action_low, first.action_high, env_cfg.terminal_on_success)
        self.instruction = self.subs[0].instruction
        self.spec = EnvSpec.from_observation(
            self.reset().obs, action_dim=len(self.action_low), num_action_chunks=int(env_cfg.num_action_chunks),
            action_low=self.action_low.tolist(), action_high=self.action_high.tolist(), instruction=self.instruction,
            reports_success=True, reports_fail=first.reports_fail, control_hz=float(first.control_hz),
            tasks=env_cfg.sub_env_tasks(int(num_envs)))

    @staticmethod
    def _choose_cameras(task, cfg: MujocoConfig) -> Dict[str, Optional[str]]:
        main, wrist = task.default_cameras
        chosen = {"main_images": cfg.main_camera or main, "wrist_images": cfg.wrist_camera or wrist}
        chosen = {k: (None if v == NO_CAMERA else v) for k, v in chosen.items()}
        for key, name in chosen.items():
            if name is not None and name not in task.camera_names:
                setting = "env.main_camera" if key == "main_images" else "env.wrist_camera"
                raise ValueError(f"{setting}={name!r} is not a camera of {cfg.name} task '{cfg.task}'; its "
                                 f"cameras: {sorted(task.camera_names)} (or 'none')")
        if chosen["main_images"] is None and (cfg.obs_mode == "rgb" or cfg.render_video):
            need = "env.obs_mode=rgb" if cfg.obs_mode == "rgb" else "a video"
            raise ValueError(f"{need} needs env.main_camera, which is 'none'; cameras: {sorted(task.camera_names)}")
        return chosen

    def _warn_unstable(self) -> None:
        if not self._warned_unstable:
            self._warned_unstable = True
            print(f"[env] {self.cfg.name} '{self.cfg.task}': the simulation went unstable (MuJoCo's bad-acceleration "
                  "warning); such episodes end as failures. A smaller physics step (env.sim_timestep) or gentler "
                  "controller gains avoid it", flush=True)

    @property
    def sub_envs(self) -> list:
        """The task simulators, one per sub-env (the family's task class): for code that reads the
        true task state, e.g. a scripted expert."""
        return [sub.task for sub in self.subs]
