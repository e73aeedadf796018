"""MuJoCo tasks (robosuite, Meta-World, Fetch) behind the batched env contract.

``MujocoEnv`` owns ``B`` simulators of one task, one per sub-env, stepped in turn (parallelism
comes from several env worker processes, as for ManiSkill's CPU simulator). It executes action
chunks, applies the time limit (``env.max_episode_steps``), ends an episode at success when
``env.end_on_success``, auto-resets finished sub-envs (their last observation in ``final_obs``)
and renders camera images with MuJoCo's own renderer on EGL.

A family supplies ``SubEnv`` (``envs/mujoco/<family>_tasks.py``), one simulator with:

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
from typing import Dict, List, Optional, Sequence

import numpy as np

from embodied_async.contracts import EnvSpec
from embodied_async.data import (
    EnvOutput,
    Observation,
    action_chunks,
    bootstrap_flags,
    concat_observations,
    final_observations,
)
from embodied_async.evaluation import VIDEO_KEY

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


class MujocoEnv:
    """``num_envs`` simulators of one MuJoCo task, stepped with action chunks ``[B, C, A]``."""

    def __init__(self, env_cfg: MujocoConfig, num_envs: int, seed: int = 0):
        self.cfg, self.num_envs = env_cfg, int(num_envs)
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        task_class = env_cfg.task_class()
        task_class.check_names(env_cfg)
        self._subs = [task_class(env_cfg, seed + i) for i in range(self.num_envs)]
        first = self._subs[0]
        self._cameras = self._choose_cameras(first)
        self._renderers = [Renderer(sub.mj_model) for sub in self._subs]
        self._low = np.asarray(first.action_low, dtype=np.float32)
        self._high = np.asarray(first.action_high, dtype=np.float32)
        self.instruction = env_cfg.instruction or first.instruction
        self._steps = np.zeros(self.num_envs, dtype=np.int64)
        self._unstable_counts = [0] * self.num_envs
        self._warned_unstable = False
        self._rows: List[Observation] = []
        self.spec = EnvSpec.from_observation(
            self.reset().obs, action_dim=len(self._low), num_action_chunks=int(env_cfg.num_action_chunks),
            action_low=self._low.tolist(), action_high=self._high.tolist(), instruction=self.instruction,
            reports_success=True, reports_fail=first.reports_fail, control_hz=float(first.control_hz))

    def _choose_cameras(self, sub) -> Dict[str, Optional[str]]:
        main, wrist = sub.default_cameras
        chosen = {"main_images": self.cfg.main_camera or main, "wrist_images": self.cfg.wrist_camera or wrist}
        chosen = {k: (None if v == NO_CAMERA else v) for k, v in chosen.items()}
        for key, name in chosen.items():
            if name is not None and name not in sub.camera_names:
                setting = "env.main_camera" if key == "main_images" else "env.wrist_camera"
                raise ValueError(f"{setting}={name!r} is not a camera of {self.cfg.name} task '{self.cfg.task}'; its "
                                 f"cameras: {sorted(sub.camera_names)} (or 'none')")
        if chosen["main_images"] is None and (self.cfg.obs_mode == "rgb" or self.cfg.render_video):
            need = "env.obs_mode=rgb" if self.cfg.obs_mode == "rgb" else "a video"
            raise ValueError(f"{need} needs env.main_camera, which is 'none'; cameras: {sorted(sub.camera_names)}")
        return chosen

    # ---- the contract ------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None) -> EnvOutput:
        """Reset every sub-env (seeds were given at construction; ``seed`` reseeds sub-env i with seed + i)."""
        self._rows = []
        for i, sub in enumerate(self._subs):
            if seed is not None:
                sub.seed(int(seed) + i)
            sub.reset()
            self._sync_unstable(i)
            self._rows.append(self._observe(i))
        self._steps[:] = 0
        return EnvOutput.after_reset(self._current_obs(), self.num_envs)

    def step(self, actions: np.ndarray) -> EnvOutput:
        actions = action_chunks(actions, self._low, self._high, self.num_envs)
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        dones, bootstrap, successes = (np.zeros(self.num_envs, dtype=bool) for _ in range(3))
        finals: Dict[int, Observation] = {}
        for i, sub in enumerate(self._subs):
            for chunk in range(actions.shape[1]):
                before = float(sub.mj_data.time)
                reward, success, fail = sub.step(actions[i, chunk])
                if self._went_unstable(i, before):  # MuJoCo reset the state mid-episode: a failure
                    reward, success, fail = 0.0, False, True
                rewards[i] += float(reward) * self.cfg.reward_scale
                successes[i] = bool(success)
                self._steps[i] += 1
                terminated = bool(fail) or (bool(success) and self.cfg.end_on_success)
                truncated = self._steps[i] >= self.cfg.max_episode_steps
                if terminated or truncated:
                    dones[i] = True
                    bootstrap[i] = bootstrap_flags(terminated, truncated, self.cfg.terminal_on_success, fail)
                    finals[i] = self._observe(i)  # before the reset: the episode's last state
                    sub.reset()
                    self._sync_unstable(i)
                    self._steps[i] = 0
                    break  # the rest of the chunk was planned for the finished episode
            self._rows[i] = self._observe(i)
        obs = self._current_obs()
        return EnvOutput(obs, rewards, dones, bootstrap, successes, np.ones(self.num_envs, dtype=bool),
                         final_obs=final_observations(obs, finals))

    def _sync_unstable(self, i: int) -> None:
        """Take sub-env ``i``'s warning count as it is after a reset (which may clear it)."""
        import mujoco

        self._unstable_counts[i] = int(self._subs[i].mj_data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number)

    def _went_unstable(self, i: int, time_before: float) -> bool:
        """Whether sub-env ``i``'s last step hit MuJoCo's bad-acceleration warning. MuJoCo then
        resets the data (time back to 0, the warning count cleared and then counted once), so the
        observed transition is not physics: seen as a changed count or as time going backwards."""
        import mujoco

        data = self._subs[i].mj_data
        count = int(data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number)
        previous, self._unstable_counts[i] = self._unstable_counts[i], count
        if count == previous and float(data.time) >= time_before:
            return False
        if not self._warned_unstable:
            self._warned_unstable = True
            print(f"[env] {self.cfg.name} '{self.cfg.task}': the simulation went unstable (MuJoCo's bad-acceleration "
                  "warning); such episodes end as failures. A smaller physics step (env.sim_timestep) or gentler "
                  "controller gains avoid it", flush=True)
        return True

    @property
    def sub_envs(self) -> list:
        """The simulators, one per sub-env (the ``SubEnv`` of the family): for code that reads the
        true task state, e.g. a scripted expert."""
        return list(self._subs)

    def reset_envs(self, indices: Sequence[int]) -> Observation:
        for i in np.atleast_1d(np.asarray(indices, dtype=np.int64)):
            self._subs[int(i)].reset()
            self._sync_unstable(int(i))
            self._steps[int(i)] = 0
            self._rows[int(i)] = self._observe(int(i))
        return self._current_obs()

    def close(self) -> None:
        for renderer in self._renderers:
            renderer.close()
        for sub in self._subs:
            sub.close()
        self._subs, self._renderers = [], []

    # ---- observations ------------------------------------------------------------------------
    def _observe(self, i: int) -> Observation:
        sub, cfg = self._subs[i], self.cfg
        row: Observation = {"states": sub.state(full=cfg.obs_mode == "state")[None].astype(np.float32)}
        if cfg.privileged_states:  # the state mode's vector, whatever this env's obs mode
            row["privileged_states"] = sub.state(full=True)[None].astype(np.float32)
        if cfg.obs_mode == "rgb":
            height, width = (int(v) for v in cfg.image_size)
            for key, camera in self._cameras.items():
                if camera is not None:
                    row[key] = self._render(i, camera, height, width)[None]
        if cfg.render_video:
            height, width = (int(v) for v in cfg.video_size)
            row[VIDEO_KEY] = self._render(i, self._cameras["main_images"], height, width)[None]
        return row

    def _render(self, i: int, camera: str, height: int, width: int) -> np.ndarray:
        sub = self._subs[i]
        return self._renderers[i].render(sub.mj_data, camera, height, width, camera in sub.upside_down_cameras)

    def _current_obs(self) -> Observation:
        obs = concat_observations(self._rows)
        obs["task_descriptions"] = [self.instruction] * self.num_envs
        return obs
