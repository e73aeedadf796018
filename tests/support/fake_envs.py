"""Simulator-free envs for tests of the graph itself (registered in this process under test-only
names; the cluster.backend=local graph runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from embodied_async.config.schema import EnvConfig
from embodied_async.contracts import EnvSpec
from embodied_async.data import EnvOutput, bootstrap_flags
from embodied_async.registry import register_family


class PointEnv:
    """A 2-D point pushed towards the origin; episodes end at a time limit (bootstrapped).

    ``faults`` maps a step count to what goes wrong then: "nan_reward" (sub-env 0),
    "inf_obs" (sub-env 1), "huge_obs" (a finite but absurd 1e30 in sub-env 2) or "crash" (the env
    raises).
    """

    def __init__(self, num_envs: int, seed: int, horizon: int = 10, faults=None):
        self.num_envs, self.horizon, self.faults = num_envs, horizon, dict(faults or {})
        self.rng = np.random.default_rng(seed)
        self.pos = self.rng.normal(size=(num_envs, 2)).astype(np.float32)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.steps = 0
        self.spec = EnvSpec(obs_shapes={"states": (2,)}, obs_dtypes={"states": "float32"}, action_dim=2,
                            action_low=(-1.0, -1.0), action_high=(1.0, 1.0), instruction="reach the origin")

    def _obs(self):
        return {"states": self.pos.copy(), "task_descriptions": ["reach the origin"] * self.num_envs}

    def reset(self, seed=None) -> EnvOutput:
        zeros = np.zeros(self.num_envs, dtype=bool)
        return EnvOutput(self._obs(), np.zeros(self.num_envs, np.float32), zeros, zeros.copy(), zeros.copy(),
                         ~zeros)

    def reset_envs(self, indices):
        self.pos[indices] = self.rng.normal(size=(len(indices), 2))
        self.t[indices] = 0
        return self._obs()

    def step(self, actions) -> EnvOutput:
        self.steps += 1
        fault = self.faults.get(self.steps)
        if fault == "crash":
            raise RuntimeError("simulator exploded at step %d" % self.steps)
        self.pos = self.pos + 0.1 * np.clip(actions[:, 0], -1, 1)
        rewards = -np.linalg.norm(self.pos, axis=1).astype(np.float32)
        self.t += 1
        dones = self.t >= self.horizon
        final = self._obs() if dones.any() else None
        if dones.any():
            self.reset_envs(np.flatnonzero(dones))
        obs = self._obs()
        if fault == "nan_reward":
            rewards[0] = np.nan
        if fault == "inf_obs":
            obs["states"][1] = np.inf
        if fault == "huge_obs":
            obs["states"][2 % self.num_envs] = 1e30
        successes = np.linalg.norm(self.pos, axis=1) < 0.1
        return EnvOutput(obs, rewards, dones, dones.copy(), successes, np.ones(self.num_envs, bool), final)

    def close(self):
        pass


def _family(class_name: str, name: str, builder: str) -> type:
    config = dataclass(type(class_name, (EnvConfig,), {
        "__annotations__": {"name": str, "builder": ClassVar[str]}, "name": name, "builder": builder,
        "__module__": __name__}))
    return register_family("env", config)


FaultyPointConfig = _family("FaultyPointConfig", "faulty_point", "fake_envs:build_faulty_point")
CrashingPointConfig = _family("CrashingPointConfig", "crashing_point", "fake_envs:build_crashing_point")
OutcomePointConfig = _family("OutcomePointConfig", "outcome_point", "fake_envs:build_outcome_point")
ScaledPointConfig = _family("ScaledPointConfig", "scaled_point", "fake_envs:build_scaled_point")


def build_faulty_point(env_cfg, num_envs, seed):
    return PointEnv(num_envs, seed, faults={3: "nan_reward", 5: "inf_obs", 7: "huge_obs", 9: "nan_reward"})


def build_crashing_point(env_cfg, num_envs, seed):
    return PointEnv(num_envs, seed, faults={4: "crash"})


class OutcomeEnv(PointEnv):
    """Sub-env ``i`` ends its episode after ``3 + i`` steps with outcome ``OUTCOMES[i % 4]``: a
    failure (terminated, ``fail``), a success (terminated, ``success``), a time limit (truncated),
    or a success again. Bootstrapping follows the framework's one rule (``bootstrap_flags``)."""

    OUTCOMES = ("fail", "success", "timeout", "success")

    def __init__(self, num_envs: int, seed: int, terminal_on_success: bool):
        super().__init__(num_envs, seed, horizon=10**9)
        self.terminal_on_success = terminal_on_success
        self.kind = np.array([self.OUTCOMES[i % 4] for i in range(num_envs)])
        self.length = 3 + np.arange(num_envs)

    def step(self, actions) -> EnvOutput:
        self.pos = self.pos + 0.1 * np.clip(actions[:, 0], -1, 1)
        self.t += 1
        ended = self.t >= self.length
        terminated = ended & (self.kind != "timeout")
        truncated = ended & (self.kind == "timeout")
        failed = ended & (self.kind == "fail")
        successes = ended & (self.kind == "success")
        bootstrap = bootstrap_flags(terminated, truncated, self.terminal_on_success, failed)
        final = self._obs() if ended.any() else None
        if ended.any():
            self.reset_envs(np.flatnonzero(ended))
        rewards = np.ones(self.num_envs, np.float32)
        return EnvOutput(self._obs(), rewards, ended, bootstrap, successes, np.ones(self.num_envs, bool), final)


def build_outcome_point(env_cfg, num_envs, seed):
    return OutcomeEnv(num_envs, seed, env_cfg.terminal_on_success)


class ScaledPointEnv(PointEnv):
    """The point env with states far from zero mean and unit scale (what a normaliser is for)."""

    def _obs(self):
        obs = super()._obs()
        obs["states"] = obs["states"] * 4.0 + 10.0
        return obs


def build_scaled_point(env_cfg, num_envs, seed):
    return ScaledPointEnv(num_envs, seed)
