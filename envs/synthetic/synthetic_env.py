"""A batched env of synthetic camera frames (the ``Env`` protocol, no simulator).

Each sub-env draws a target position in [-1, 1] per episode, shown as a bright marker on a
textured background; a cursor starts in the middle and moves by 0.1 x the first action value per
step. The reward is the decrease of the cursor's distance to the target, success is reaching it
(within 0.05), which ends the episode; so is the time limit (truncation).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from embodied_async.contracts import EnvSpec
from embodied_async.data import EnvOutput, bootstrap_flags
from embodied_async.evaluation import VIDEO_KEY

from .configuration_synthetic import SyntheticImageConfig

STEP_SIZE, REACHED = 0.1, 0.05


class SyntheticImageEnv:
    def __init__(self, env_cfg: SyntheticImageConfig, num_envs: int, seed: int = 0):
        self.cfg, self.num_envs = env_cfg, int(num_envs)
        self.height, self.width = (int(v) for v in env_cfg.image_size)
        self.max_steps = int(env_cfg.max_episode_steps)
        self.rng = np.random.default_rng(seed)
        # a fixed texture per run: gradients plus noise, so frames are never one colour
        rows = np.linspace(0, 120, self.height, dtype=np.float32)[:, None, None]
        cols = np.linspace(0, 80, self.width, dtype=np.float32)[None, :, None]
        noise = self.rng.integers(0, 40, (self.height, self.width, 3))
        self.background = np.clip(rows + cols + noise + np.array([20, 40, 60]), 0, 255).astype(np.uint8)
        self.targets = np.zeros(self.num_envs, dtype=np.float32)
        self.cursors = np.zeros(self.num_envs, dtype=np.float32)
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        self.spec = EnvSpec.from_observation(
            self.reset(seed=seed).obs, action_dim=env_cfg.action_dim, num_action_chunks=env_cfg.num_action_chunks,
            action_low=[-1.0] * env_cfg.action_dim, action_high=[1.0] * env_cfg.action_dim,
            instruction=env_cfg.instruction, reports_success=True, reports_fail=False)

    def _new_episodes(self, rows: np.ndarray) -> None:
        self.targets[rows] = self.rng.uniform(-1.0, 1.0, len(rows))
        self.cursors[rows] = 0.0
        self.steps[rows] = 0

    def _column(self, position: np.ndarray) -> np.ndarray:
        return ((position + 1.0) / 2.0 * (self.width - 1)).astype(np.int64)

    def _observe(self) -> dict:
        frames = np.broadcast_to(self.background, (self.num_envs, self.height, self.width, 3)).copy()
        half = max(2, self.height // 20)
        middle = self.height // 2
        for i, (target, cursor) in enumerate(zip(self._column(self.targets), self._column(self.cursors))):
            frames[i, middle - 3 * half:middle - half, max(0, target - half):target + half] = (255, 220, 0)
            frames[i, middle + half:middle + 3 * half, max(0, cursor - half):cursor + half] = (0, 120, 255)
        obs = {"main_images": frames, "states": self.cursors[:, None].copy(),
               "task_descriptions": [self.cfg.instruction] * self.num_envs}
        if self.cfg.render_video:  # the camera's frames at the video size (nearest pixel)
            height, width = (int(v) for v in self.cfg.video_size)
            rows = np.arange(height) * self.height // height
            cols = np.arange(width) * self.width // width
            obs[VIDEO_KEY] = frames[:, rows][:, :, cols]
        return obs

    def reset(self, seed: Optional[int] = None) -> EnvOutput:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._new_episodes(np.arange(self.num_envs))
        return EnvOutput.after_reset(self._observe(), self.num_envs)

    def step(self, actions: np.ndarray) -> EnvOutput:
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim == 2:
            actions = actions[:, None]
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        dones = np.zeros(self.num_envs, dtype=bool)
        successes = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for chunk in range(actions.shape[1]):
            live = ~dones
            before = np.abs(self.cursors - self.targets)
            moved = np.clip(self.cursors + STEP_SIZE * np.clip(actions[:, chunk, 0], -1, 1), -1, 1)
            self.cursors = np.where(live, moved, self.cursors)
            after = np.abs(self.cursors - self.targets)
            rewards += np.where(live, before - after, 0.0).astype(np.float32)
            self.steps += live
            reached = live & (after < REACHED)
            out_of_time = live & ~reached & (self.steps >= self.max_steps)
            successes |= reached
            truncated |= out_of_time
            dones |= reached | out_of_time
        bootstrap = bootstrap_flags(successes, truncated, self.cfg.terminal_on_success, np.zeros_like(dones)) & dones
        final_obs = self._observe() if dones.any() else None
        self._new_episodes(np.flatnonzero(dones))
        return EnvOutput(self._observe(), rewards, dones, bootstrap, successes, np.ones(self.num_envs, dtype=bool),
                         final_obs=final_obs)

    def reset_envs(self, indices: Sequence[int]) -> dict:
        self._new_episodes(np.asarray(indices, dtype=np.int64))
        return self._observe()

    def close(self) -> None:
        pass
