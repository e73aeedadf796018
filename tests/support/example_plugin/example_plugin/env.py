"""A point that drifts under the actions towards the origin (the Env protocol), numpy only."""

from __future__ import annotations

import numpy as np

from embodied_async.contracts import EnvSpec
from embodied_async.data import EnvOutput, bootstrap_flags

from .configuration import DriftPointConfig


class DriftPointEnv:
    def __init__(self, cfg: DriftPointConfig, num_envs: int, seed: int):
        self.cfg, self.num_envs = cfg, num_envs
        self.rng = np.random.default_rng(seed)
        self.pos = self.rng.normal(size=(num_envs, cfg.dims)).astype(np.float32)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.spec = EnvSpec.from_observation(self._obs(), action_dim=cfg.dims,
                                             num_action_chunks=cfg.num_action_chunks,
                                             action_low=[-1.0] * cfg.dims, action_high=[1.0] * cfg.dims,
                                             instruction="drift to the origin")

    def _obs(self):
        return {"states": self.pos.copy(), "task_descriptions": ["drift to the origin"] * self.num_envs}

    def reset(self, seed=None) -> EnvOutput:
        flags = np.zeros(self.num_envs, dtype=bool)
        return EnvOutput(self._obs(), np.zeros(self.num_envs, np.float32), flags, flags.copy(), flags.copy(), ~flags)

    def reset_envs(self, indices):
        self.pos[indices] = self.rng.normal(size=(len(indices), self.cfg.dims))
        self.t[indices] = 0
        return self._obs()

    def step(self, actions) -> EnvOutput:
        rewards = np.zeros(self.num_envs, np.float32)
        for chunk in np.transpose(np.clip(actions, -1, 1), (1, 0, 2)):  # the chunk's actions in order
            self.pos += 0.1 * chunk.astype(np.float32)
            rewards -= np.linalg.norm(self.pos, axis=1)
        self.t += 1
        truncated = self.t >= self.cfg.horizon
        terminated = np.zeros_like(truncated)
        successes = np.linalg.norm(self.pos, axis=1) < 0.2
        final = self._obs() if truncated.any() else None
        if truncated.any():
            self.reset_envs(np.flatnonzero(truncated))
        bootstrap = bootstrap_flags(terminated, truncated, self.cfg.terminal_on_success)
        return EnvOutput(self._obs(), rewards, truncated, bootstrap, successes, np.ones(self.num_envs, bool), final)

    def close(self) -> None:
        pass
