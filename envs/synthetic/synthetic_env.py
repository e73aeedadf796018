"""A batched env of synthetic camera frames (the ``Env`` protocol, no simulator).

Each sub-env draws a target position in [-1, 1] per episode, shown as a bright marker on a
textured background; a cursor starts in the middle and moves by 0.1 x the first action value per
step. The reward is the decrease of the cursor's distance to the target, success is reaching it
(within 0.05), which ends the episode; so is the time limit (truncation).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from embodied_async.contracts import EnvSpec, SubStep
from embodied_async.data import Observation
from embodied_async.evaluation import VIDEO_KEY
from embodied_async.serial_env import SerialEnv

from .configuration_synthetic import SyntheticImageConfig

STEP_SIZE, REACHED = 0.1, 0.05


class SyntheticSubEnv:
    """One cursor and one marker on the run's textured background (a ``contracts.SubEnv``)."""

    def __init__(self, cfg: SyntheticImageConfig, background: np.ndarray, seed: int,
                 nan_reward_at_step: Optional[int] = None):
        self.cfg, self.background = cfg, background
        self.instruction = cfg.instruction
        self.rng = np.random.default_rng(seed)
        self.target, self.cursor, self.steps = 0.0, 0.0, 0
        # the env.nan_reward_at_step drill: counted over episodes, so it fires once
        self.nan_reward_at_step, self.steps_since_built = nan_reward_at_step, 0

    def reset(self, seed: Optional[int] = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.target, self.cursor, self.steps = float(self.rng.uniform(-1.0, 1.0)), 0.0, 0

    def step(self, action: np.ndarray) -> SubStep:
        before = abs(self.cursor - self.target)
        self.cursor = float(np.clip(self.cursor + STEP_SIZE * np.clip(action[0], -1, 1), -1, 1))
        after = abs(self.cursor - self.target)
        self.steps += 1
        self.steps_since_built += 1
        reached = after < REACHED
        reward = np.nan if self.steps_since_built == self.nan_reward_at_step else before - after
        return SubStep(reward=reward, success=reached, terminated=reached,
                       truncated=not reached and self.steps >= int(self.cfg.max_episode_steps))

    def _column(self, position: float) -> int:
        return int((position + 1.0) / 2.0 * (self.background.shape[1] - 1))

    def observe(self) -> Observation:
        frame = self.background.copy()
        height = frame.shape[0]
        half, middle = max(2, height // 20), height // 2
        target, cursor = self._column(self.target), self._column(self.cursor)
        frame[middle - 3 * half:middle - half, max(0, target - half):target + half] = (255, 220, 0)
        frame[middle + half:middle + 3 * half, max(0, cursor - half):cursor + half] = (0, 120, 255)
        row: Observation = {"main_images": frame[None], "states": np.array([[self.cursor]], dtype=np.float32)}
        if self.cfg.render_video:  # the camera's frame at the video size (nearest pixel)
            video_height, video_width = (int(v) for v in self.cfg.video_size)
            rows = np.arange(video_height) * frame.shape[0] // video_height
            cols = np.arange(video_width) * frame.shape[1] // video_width
            row[VIDEO_KEY] = frame[rows][:, cols][None]
        return row

    def close(self) -> None:
        pass


class SyntheticImageEnv(SerialEnv):
    def __init__(self, env_cfg: SyntheticImageConfig, num_envs: int, seed: int = 0):
        self.cfg = env_cfg
        height, width = (int(v) for v in env_cfg.image_size)
        # a fixed texture per run: gradients plus noise, so frames are never one colour
        rng = np.random.default_rng(seed)
        rows = np.linspace(0, 120, height, dtype=np.float32)[:, None, None]
        cols = np.linspace(0, 80, width, dtype=np.float32)[None, :, None]
        noise = rng.integers(0, 40, (height, width, 3))
        background = np.clip(rows + cols + noise + np.array([20, 40, 60]), 0, 255).astype(np.uint8)
        bounds = [1.0] * env_cfg.action_dim
        subs = [SyntheticSubEnv(env_cfg, background, seed + i, env_cfg.nan_reward_at_step if i == 0 else None)
                for i in range(int(num_envs))]
        super().__init__(subs, [-b for b in bounds], bounds, env_cfg.terminal_on_success)
        self.spec = EnvSpec.from_observation(
            self.reset(seed=seed).obs, action_dim=env_cfg.action_dim, num_action_chunks=env_cfg.num_action_chunks,
            action_low=self.action_low.tolist(), action_high=self.action_high.tolist(),
            instruction=env_cfg.instruction, reports_success=True, reports_fail=False)

    @property
    def targets(self) -> np.ndarray:
        """Each sub-env's marker position in [-1, 1] (for scripted tests and experts)."""
        return np.array([sub.target for sub in self.subs], dtype=np.float32)

    @property
    def cursors(self) -> np.ndarray:
        return np.array([sub.cursor for sub in self.subs], dtype=np.float32)
