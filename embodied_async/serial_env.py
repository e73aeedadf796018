"""``SerialEnv``: the ``Env`` protocol over sub-envs stepped one after another in this process.

Written once for every family whose simulators run one episode each (MuJoCo's, ManiSkill's CPU
simulator, the synthetic env): a family supplies its ``contracts.SubEnv`` objects and the action
bounds; this class executes the action chunks, ends a sub-env's chunk where its episode ends (the
rest was planned for that episode), keeps the last observation of a finished episode in
``final_obs``, auto-resets, applies the one bootstrap rule and counts the env steps executed.
Parallelism comes from several env worker processes, and from sub-envs whose simulators run in
child processes (``contracts.ConcurrentSubEnv``): those are all sent their chunk before any reply
is read, so they simulate at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from embodied_async.contracts import ConcurrentSubEnv, ResetSeed, SubEnv, sub_env_seeds
from embodied_async.data import (
    EnvOutput,
    Observation,
    action_chunks,
    bootstrap_flags,
    concat_observations,
    final_observations,
)


@dataclass
class ChunkResult:
    """One sub-env's part of a step: the chunk's summed reward and executed steps, its last step's
    flags, the finished episode's last observation (None if it goes on) and the observation after
    it (the next episode's first where it finished)."""

    reward: float
    executed: int
    success: bool
    terminated: bool
    truncated: bool
    fail: bool
    final_obs: Optional[Observation]
    obs: Observation


def run_chunk(sub: SubEnv, chunk: np.ndarray) -> ChunkResult:
    """Execute one sub-env's action chunk ``[C, A]``, ending it where the episode ends (the rest
    was planned for that episode) and resetting; where the sub-env runs in a child process, the
    child runs this (one message a chunk)."""
    reward, executed = 0.0, 0
    for action in chunk:
        result = sub.step(action)
        executed += 1
        reward += float(result.reward)
        if result.terminated or result.truncated:
            final = sub.observe()  # before the reset: the episode's last observation
            sub.reset()
            break
    else:
        final = None
    return ChunkResult(reward, executed, bool(result.success), bool(result.terminated), bool(result.truncated),
                       bool(result.fail), final, sub.observe())


def _call_here(sub: SubEnv, call: str, args: tuple) -> Any:
    return run_chunk(sub, *args) if call == "run_chunk" else getattr(sub, call)(*args)


class SerialEnv:
    """``num_envs`` sub-envs (``subs``), actions within ``[action_low, action_high]``;
    ``terminal_on_success``: a success end is terminal (no bootstrap). A family's env subclasses
    it (or builds one) and sets ``spec`` after its first reset."""

    def __init__(self, subs: Sequence[SubEnv], action_low: Sequence[float], action_high: Sequence[float],
                 terminal_on_success: bool):
        if not subs:
            raise ValueError("a serial env needs at least one sub-env")
        self.subs: List[SubEnv] = list(subs)
        self._concurrent = [isinstance(sub, ConcurrentSubEnv) for sub in self.subs]
        self.num_envs = len(self.subs)
        self.action_low = np.asarray(action_low, dtype=np.float32)
        self.action_high = np.asarray(action_high, dtype=np.float32)
        self.terminal_on_success = bool(terminal_on_success)
        self._rows: List[Observation] = []

    def reset(self, seed: ResetSeed = None) -> EnvOutput:
        """Reset every sub-env (``seed``: an int reseeds sub-env ``i`` with ``seed + i``, a list gives
        each its own; None continues their RNGs)."""
        seeds = sub_env_seeds(seed, self.num_envs)
        self._on_each("reset", [(None if seeds is None else seeds[i],) for i in range(self.num_envs)])
        self._rows = self._on_each("observe", [()] * self.num_envs)
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
        for i, result in enumerate(self._on_each("run_chunk", [(chunk,) for chunk in actions])):
            rewards[i], executed[i], successes[i] = result.reward, result.executed, result.success
            if result.final_obs is not None:
                dones[i] = True
                bootstrap[i] = bootstrap_flags(result.terminated, result.truncated, self.terminal_on_success,
                                               result.fail)
                finals[i] = result.final_obs
            self._rows[i] = result.obs
        obs = self._current_obs()
        return EnvOutput(obs, rewards, dones, bootstrap, successes, np.ones(n, dtype=bool),
                         final_obs=final_observations(obs, finals), env_steps=executed)

    def reset_envs(self, indices: Sequence[int]) -> Observation:
        """Reset only the sub-envs ``indices``; return the full current observation."""
        chosen = [int(i) for i in np.atleast_1d(np.asarray(indices, dtype=np.int64))]
        self._on_each("reset", [()] * len(chosen), chosen)
        for i, row in zip(chosen, self._on_each("observe", [()] * len(chosen), chosen)):
            self._rows[i] = row
        return self._current_obs()

    def _on_each(self, call: str, args: Sequence[tuple], indices: Optional[Sequence[int]] = None) -> List[Any]:
        """``call`` (a sub-env method, or ``run_chunk``) on each sub-env (``indices``: those only),
        with its ``args``: sub-envs in child processes all sent theirs first, so they work at once;
        the others called in turn. Every reply is read before an error is raised, so the
        children's pipes stay in step."""
        chosen = range(self.num_envs) if indices is None else indices
        for i, each in zip(chosen, args):
            if self._concurrent[i]:
                self.subs[i].send_call(call, *each)
        results, errors = [], []
        for i, each in zip(chosen, args):
            try:
                sub = self.subs[i]
                results.append(sub.receive_reply(call) if self._concurrent[i] else _call_here(sub, call, each))
            except Exception as err:  # raised below, once every child replied
                results.append(None)
                errors.append(err)
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        """Release the simulators (idempotent)."""
        for sub in self.subs:
            sub.close()
        self.subs = []

    def _current_obs(self) -> Observation:
        obs = concat_observations(self._rows)
        obs["task_descriptions"] = [sub.instruction for sub in self.subs]
        return obs
