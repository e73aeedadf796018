"""Typed messages that travel on the channels: one message type per channel.

Arrays are numpy on the env side (cheap to serialise between processes) and torch tensors on the
policy side. Leading dimensions: ``B`` sub-environments, ``T`` decisions, ``C`` action chunks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

# Observation dict keys (ARCHITECTURE.md, "The contracts"): main_images uint8 [B, H, W, 3], wrist_images (optional),
# states float32 [B, D], task_descriptions list of B strings.
Observation = Dict[str, Any]


def slice_observation(obs: Observation, index) -> Observation:
    """Rows ``index`` (a slice, an int array or a bool mask) of every entry of ``obs``."""
    out: Observation = {}
    for key, value in obs.items():
        if isinstance(value, list):
            rows = np.arange(len(value))[index]
            out[key] = [value[i] for i in np.atleast_1d(rows)]
        else:
            out[key] = value[index]
    return out


def concat_observations(parts: List[Observation]) -> Observation:
    """Concatenate observation dicts along the batch dimension."""
    out: Observation = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if isinstance(values[0], list):
            out[key] = [item for v in values for item in v]
        elif hasattr(values[0], "dim"):  # torch tensors
            import torch

            out[key] = torch.cat(values, dim=0)
        else:
            out[key] = np.concatenate(values, axis=0)
    return out


def action_chunks(actions, low: np.ndarray, high: np.ndarray, num_envs: int) -> np.ndarray:
    """An env's ``step`` input as float32 ``[B, C, A]`` within the action bounds (``[B, A]`` is
    read as ``C = 1``); a wrong shape is an error naming the expected one."""
    actions = np.asarray(actions, dtype=np.float32)
    if actions.ndim == 2:
        actions = actions[:, None]
    expected = (num_envs, len(low))
    if actions.ndim != 3 or (actions.shape[0], actions.shape[2]) != expected:
        raise ValueError(f"actions must be [B, C, A] with (B, A)={expected}; got {actions.shape}")
    return np.clip(actions, low, high)


def final_observations(obs: Observation, finals: Dict[int, Observation]) -> Optional[Observation]:
    """``EnvOutput.final_obs`` from the current observation and the last observations (batches of
    one) of the sub-envs that finished: the others' rows repeat ``obs``; None when none finished."""
    if not finals:
        return None
    final_obs = {k: (list(v) if isinstance(v, list) else v.copy()) for k, v in obs.items()}
    for i, row in finals.items():
        for key, value in row.items():
            if key != "task_descriptions":
                final_obs[key][i] = value[0]
    return final_obs


def bootstrap_flags(terminated, truncated, terminal_on_success: bool, failed=None) -> np.ndarray:
    """Which finished sub-envs bootstrap their value from the final observation (every env family
    uses this one rule):

    - a failure (``info["fail"]``, where the task has one) is always terminal: no bootstrap;
    - a time limit (truncation) always bootstraps;
    - any other termination (success) bootstraps unless ``terminal_on_success``. ManiSkill ends
      dense tasks at success while the reward would keep paying: treating that end as terminal
      teaches the policy to hover short of the goal.

    A termination at the time limit is still a termination (gymnasium's convention).
    """
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    failed = np.zeros_like(terminated) if failed is None else np.asarray(failed, dtype=bool)
    bootstrap = truncated & ~terminated if terminal_on_success else terminated | truncated
    return bootstrap & ~failed


@dataclass
class EnvOutput:
    """What an env worker sends after ``reset`` or after executing one action chunk.

    ``rewards``/``dones`` describe the chunk just executed (zeros after a reset). When a sub-env
    finishes, it is auto-reset: ``obs`` holds the first observation of its new episode and
    ``final_obs`` the last observation of the finished one (rows of sub-envs that did not finish
    repeat ``obs``). ``bootstrap`` marks finished sub-envs whose value must be bootstrapped from
    ``final_obs`` (time limits always; terminations when the env says they are not terminal).
    ``valid`` is False where the env produced a non-finite reward or observation: that sample is
    dropped from the loss and the sub-env was reset. ``env_steps``: the simulator steps each
    sub-env executed for this chunk (fewer than the chunk where its episode ended part-way: the
    rest was planned for the finished episode); None from a family that does not say, read as
    the whole chunk (``executed_steps``). ``generation``: which start of its env rank's link to
    its rollout worker it belongs to (0, then one more each time the runner replaced the env
    process or the rollout process at either end): what was sent before is dropped.
    """

    obs: Observation
    rewards: np.ndarray  # float32 [B]
    dones: np.ndarray  # bool [B]
    bootstrap: np.ndarray  # bool [B]
    successes: np.ndarray  # bool [B]
    valid: np.ndarray  # bool [B]
    final_obs: Optional[Observation] = None
    env_steps: Optional[np.ndarray] = None  # int64 [B]
    generation: int = 0

    def executed_steps(self, num_action_chunks: int) -> np.ndarray:
        """Simulator steps each sub-env executed for this output (int64 ``[B]``)."""
        if self.env_steps is None:
            return np.full(self.num_envs, int(num_action_chunks), dtype=np.int64)
        return np.asarray(self.env_steps, dtype=np.int64)

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[0])

    @classmethod
    def after_reset(cls, obs: Observation, num_envs: int) -> "EnvOutput":
        """The output of a reset: ``obs``, zero rewards, no episode ended, every sample valid."""
        flags = [np.zeros(num_envs, dtype=bool) for _ in range(3)]
        return cls(obs, np.zeros(num_envs, np.float32), *flags, np.ones(num_envs, dtype=bool),
                   env_steps=np.zeros(num_envs, dtype=np.int64))

    @classmethod
    def concat(cls, parts: List["EnvOutput"]) -> "EnvOutput":
        """Concatenate several outputs (e.g. of env workers serving one rollout) along ``B``."""
        if len(parts) == 1:
            return parts[0]
        values: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "final_obs":
                if any(p.final_obs is not None for p in parts):  # rows that did not finish repeat obs
                    values[f.name] = concat_observations([p.obs if p.final_obs is None else p.final_obs
                                                          for p in parts])
            elif f.name == "obs":
                values[f.name] = concat_observations([p.obs for p in parts])
            elif f.name == "generation":
                values[f.name] = parts[0].generation
            elif f.name == "env_steps":
                if all(p.env_steps is not None for p in parts):  # else: unknown, the whole chunk
                    values[f.name] = np.concatenate([p.env_steps for p in parts])
            else:
                values[f.name] = np.concatenate([getattr(p, f.name) for p in parts])
        return cls(**values)


@dataclass
class PolicyOutput:
    """What a policy returns for a batch of observations (one decision per sub-env).

    ``actions`` is ``[B, num_action_chunks, action_dim]``; ``logprobs`` and ``values`` are per
    decision ``[B]``; ``forward_inputs`` holds exactly the tensors ``evaluate`` needs to recompute
    the log-probs of ``actions`` (leading dimension ``B``).
    """

    actions: Any
    logprobs: Any
    values: Any
    forward_inputs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ActionMessage:
    """Rollout -> env: the chunk to execute next, answering the outputs of ``generation`` (an
    answer sent before the link's last replacement is left unexecuted)."""

    actions: np.ndarray  # float32 [B, C, A]
    generation: int = 0


# Where a field's sub-env dimension is: every batched operation below is written once from it.
PER_STEP = {"env_dim": 1}  # [T, B, ...]
PER_ENV = {"env_dim": 0}  # [B, ...]
UNBATCHED = {"env_dim": None}


def map_tree(fn: Callable, value: Any) -> Any:
    """``fn`` on a tensor, or on every tensor of a (nested) dict of them (None stays None)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: map_tree(fn, v) for k, v in value.items()}
    return fn(value)


def _zip_tree(fn: Callable, values: List[Any]) -> Any:
    """``fn(list of tensors)`` on aligned tensors of several values with the same (dict) structure
    (None where the first is None)."""
    if values[0] is None:
        return None
    if isinstance(values[0], dict):
        return {k: _zip_tree(fn, [v[k] for v in values]) for k in values[0]}
    return fn(values)


@dataclass
class StepRecord:
    """One decision of ``B`` sub-envs, as the rollout records it (each field ``[B, ...]``): the
    per-step fields of ``Trajectory``, which ``Trajectory.stack`` stacks by name."""

    forward_inputs: Dict[str, Any]
    actions: Any
    logprobs: Any
    values: Any
    versions: Any
    rewards: Any = None
    dones: Any = None
    bootstrap_values: Any = None
    loss_mask: Any = None
    executed_actions: Any = None


@dataclass
class Trajectory:
    """Rollout -> actor: ``T`` consecutive decisions of ``B`` sub-envs (torch tensors, CPU).

    ``rewards[t]``/``dones[t]`` are the outcome of the action taken at ``t``. ``bootstrap_values[t]``
    is ``V(final_obs)`` where the episode ended at ``t`` and bootstraps (0 elsewhere);
    ``next_values`` is the value of the observation after the last step. ``versions[t]`` is the
    policy version that sampled the action at ``t``; ``executed_actions[t]`` how many actions of
    its chunk the env executed (fewer where the episode ended part-way; None: all of them).
    ``obs_moments`` holds, per observation normaliser of the policy, the moments of the raw
    features seen while collecting (the actor merges them into the run's one normaliser).
    """

    forward_inputs: Dict[str, Any] = field(metadata=PER_STEP)  # each [T, B, ...]
    actions: Any = field(metadata=PER_STEP)  # [T, B, C, A]
    logprobs: Any = field(metadata=PER_STEP)  # [T, B]
    values: Any = field(metadata=PER_STEP)  # [T, B]
    rewards: Any = field(metadata=PER_STEP)  # [T, B]
    dones: Any = field(metadata=PER_STEP)  # [T, B] bool
    bootstrap_values: Any = field(metadata=PER_STEP)  # [T, B]
    loss_mask: Any = field(metadata=PER_STEP)  # [T, B] bool
    versions: Any = field(metadata=PER_STEP)  # [T, B] int64
    next_values: Any = field(metadata=PER_ENV)  # [B]
    obs_moments: Dict[str, Any] = field(default_factory=dict, metadata=UNBATCHED)
    executed_actions: Any = field(default=None, metadata=PER_STEP)  # [T, B] int64

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @classmethod
    def batched_fields(cls, metadata: Optional[dict] = None) -> List[dataclasses.Field]:
        """The fields with a sub-env dimension (only those of ``metadata``'s layout when given)."""
        return [f for f in dataclasses.fields(cls) if f.metadata["env_dim"] is not None
                and (metadata is None or f.metadata["env_dim"] == metadata["env_dim"])]

    @classmethod
    def stack(cls, steps: List[StepRecord], next_values: Any, obs_moments: Optional[dict] = None) -> "Trajectory":
        """``T`` step records -> a trajectory (every per-step field stacked along a new dim 0)."""
        import torch

        per_step = {f.name: _zip_tree(torch.stack, [getattr(s, f.name) for s in steps])
                    for f in cls.batched_fields(PER_STEP)}
        return cls(**per_step, next_values=next_values, obs_moments=dict(obs_moments or {}))

    def map(self, fn: Callable[[Any, int], Any]) -> "Trajectory":
        """A trajectory with ``fn(tensor, env_dim)`` applied to every batched tensor; moments kept."""
        return dataclasses.replace(self, **{
            f.name: map_tree(lambda t, d=f.metadata["env_dim"]: fn(t, d), getattr(self, f.name))
            for f in self.batched_fields()})

    @classmethod
    def concat(cls, parts: List["Trajectory"]) -> "Trajectory":
        """Concatenate shards or streams along the sub-env dimension (moments are not carried over:
        the actor merges each part's moments on its own)."""
        import torch

        return cls(**{f.name: _zip_tree(lambda ts, d=f.metadata["env_dim"]: torch.cat(ts, dim=d),
                                        [getattr(p, f.name) for p in parts])
                      for f in cls.batched_fields()})

    def split(self, num_shards: int) -> List["Trajectory"]:
        """Split along the sub-env dimension into ``num_shards`` equal parts (one per actor rank);
        every shard carries the moments (each actor rank keeps the same normaliser)."""
        if self.num_envs % num_shards:
            raise ValueError(f"{self.num_envs} envs do not split into {num_shards} actor shards")
        size = self.num_envs // num_shards

        def rows(i: int):
            return lambda t, dim: t.narrow(dim, i * size, size)

        return [self.map(rows(i)) for i in range(num_shards)]


@dataclass
class WeightMessage:
    """Actor -> rollout: new weights (trainable parameters and the observation statistics), the
    version they carry, and per stream of the receiving rollout rank how many of its
    trajectories the actor has consumed or dropped so far (the rollout's throttle)."""

    version: int
    # ``channel.share(state_dict)``: one stored copy for all rollout ranks
    weights: Any
    acknowledged: Dict[int, int] = field(default_factory=dict)
    # the staleness bound the actor set for the trajectories started from now on
    # (algorithm.staleness_control=kl moves it); None: the configured one
    staleness_threshold: Optional[int] = None
    # sent to a rollout worker that replaced a dead or hung one: per stream, the trajectories the
    # actor has accounted for (acknowledged, held or still in the channel), where its counts begin
    shipped: Optional[Dict[int, int]] = None

    @property
    def state_dict(self) -> Dict[str, Any]:
        return self.weights.get()
