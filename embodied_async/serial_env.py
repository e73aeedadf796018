"""``SerialEnv``: the ``Env`` protocol over sub-envs stepped one after another in this process.

Written once for every family whose simulators run one episode each (MuJoCo's, ManiSkill's CPU
simulator, the synthetic env): a family supplies its ``contracts.SubEnv`` objects and the action
bounds; this class executes the action chunks, ends a sub-env's chunk where its episode ends (the
rest was planned for that episode), keeps the last observation of a finished episode in
``final_obs``, auto-resets, applies the one bootstrap rule and counts the env steps executed.
Parallelism comes from several env worker processes.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from embodied_async.contracts import ResetSeed, SubEnv, sub_env_seeds
from embodied_async.data import (
    EnvOutput,
    Observation,
    action_chunks,
    bootstrap_flags,
    concat_observations,
    final_observations,
)


class SerialEnv:
    """``num_envs`` sub-envs (``subs``), actions within ``[action_low, action_high]``;
    ``terminal_on_success``: a success end is terminal (no bootstrap). A family's env subclasses
    it (or builds one) and sets ``spec`` after its first reset."""

    def __init__(self, subs: Sequence[SubEnv], action_low: Sequence[float], action_high: Sequence[float],
                 terminal_on_success: bool):
        if not subs:
            raise ValueError("a serial env needs at least one sub-env")
        self.subs: List[SubEnv] = list(subs)
        self.num_envs = len(self.subs)
        self.action_low = np.asarray(action_low, dtype=np.float32)
        self.action_high = np.asarray(action_high, dtype=np.float32)
        self.terminal_on_success = bool(terminal_on_success)
        self._rows: List[Observation] = []

    def reset(self, seed: ResetSeed = None) -> EnvOutput:
        """Reset every sub-env (``seed``: an int reseeds sub-env ``i`` with ``seed + i``, a list gives
        each its own; None continues their RNGs)."""
        seeds = sub_env_seeds(seed, self.num_envs)
        for i, sub in enumerate(self.subs):
            sub.reset(None if seeds is None else seeds[i])
        self._rows = [sub.observe() for sub in self.subs]
        self._check_rows_alike()
        return EnvOutput.after_reset(self._current_obs(), self.num_envs)

    def _check_rows_alike(self) -> None:
        """Sub-envs of several tasks must observe alike: the policy batches their rows."""
        def layout(row: Observation) -> Dict[str, tuple]:
            return {k: (np.shape(v)[1:], np.asarray(v).dtype.name) for k, v in row.items()}

        first = layout(self._rows[0])
        for sub, row in zip(self.subs, self._rows):
            if layout(row) != first:
                raise ValueError(f"the sub-env of '{sub.instruction}' observes {layout(row)}, the first sub-env "
                                 f"('{self.subs[0].instruction}') {first}: the tasks of one env (env.tasks) must "
                                 "give observations of the same keys, shapes and dtypes")

    def step(self, actions: np.ndarray) -> EnvOutput:
        """Execute one action chunk ``[B, C, A]`` (``[B, A]`` is read as ``C = 1``)."""
        actions = action_chunks(actions, self.action_low, self.action_high, self.num_envs)
        n = self.num_envs
        rewards, executed = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.int64)
        dones, bootstrap, successes = (np.zeros(n, dtype=bool) for _ in range(3))
        finals: Dict[int, Observation] = {}
        for i, sub in enumerate(self.subs):
            for action in actions[i]:
                result = sub.step(action)
                executed[i] += 1
                rewards[i] += float(result.reward)
                successes[i] = bool(result.success)
                if result.terminated or result.truncated:
                    dones[i] = True
                    bootstrap[i] = bootstrap_flags(result.terminated, result.truncated, self.terminal_on_success,
                                                   result.fail)
                    finals[i] = sub.observe()  # before the reset: the episode's last observation
                    sub.reset()
                    break  # the rest of the chunk was planned for the finished episode
            self._rows[i] = sub.observe()
        obs = self._current_obs()
        return EnvOutput(obs, rewards, dones, bootstrap, successes, np.ones(n, dtype=bool),
                         final_obs=final_observations(obs, finals), env_steps=executed)

    def reset_envs(self, indices: Sequence[int]) -> Observation:
        """Reset only the sub-envs ``indices``; return the full current observation."""
        for i in np.atleast_1d(np.asarray(indices, dtype=np.int64)):
            self.subs[int(i)].reset()
            self._rows[int(i)] = self.subs[int(i)].observe()
        return self._current_obs()

    def close(self) -> None:
        """Release the simulators (idempotent)."""
        for sub in self.subs:
            sub.close()
        self.subs = []

    def _current_obs(self) -> Observation:
        obs = concat_observations(self._rows)
        obs["task_descriptions"] = [sub.instruction for sub in self.subs]
        return obs
