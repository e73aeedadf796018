"""Typed messages that travel on the channels: one message type per channel.

Arrays are numpy on the env side (cheap to serialise between processes) and torch tensors on the
policy side. Leading dimensions: ``B`` sub-environments, ``T`` decisions, ``C`` action chunks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

# Observation dict keys (DESIGN.md): main_images uint8 [B, H, W, 3], wrist_images (optional),
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
    dropped from the loss and the sub-env was reset.
    """

    obs: Observation
    rewards: np.ndarray  # float32 [B]
    dones: np.ndarray  # bool [B]
    bootstrap: np.ndarray  # bool [B]
    successes: np.ndarray  # bool [B]
    valid: np.ndarray  # bool [B]
    final_obs: Optional[Observation] = None

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[0])


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
    """Rollout -> env: the chunk to execute next."""

    actions: np.ndarray  # float32 [B, C, A]


@dataclass
class Trajectory:
    """Rollout -> actor: ``T`` consecutive decisions of ``B`` sub-envs (torch tensors, CPU).

    ``rewards[t]``/``dones[t]`` are the outcome of the action taken at ``t``. ``bootstrap_values[t]``
    is ``V(final_obs)`` where the episode ended at ``t`` and bootstraps (0 elsewhere);
    ``next_values`` is the value of the observation after the last step. ``versions[t]`` is the
    policy version that sampled the action at ``t``. ``obs_moments`` holds, per observation
    normaliser of the policy, the moments of the raw features seen while collecting (the actor
    merges them into the run's one normaliser).
    """

    forward_inputs: Dict[str, Any]  # each [T, B, ...]
    actions: Any  # [T, B, C, A]
    logprobs: Any  # [T, B]
    values: Any  # [T, B]
    rewards: Any  # [T, B]
    dones: Any  # [T, B] bool
    bootstrap_values: Any  # [T, B]
    loss_mask: Any  # [T, B] bool
    versions: Any  # [T, B] int64
    next_values: Any  # [B]
    obs_moments: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @classmethod
    def concat(cls, parts: List["Trajectory"]) -> "Trajectory":
        """Concatenate shards or streams along the env dimension (moments are not carried over:
        the actor merges each part's moments on its own)."""
        values: Dict[str, Any] = {}
        import torch

        for f in dataclasses.fields(cls):
            if f.name == "forward_inputs":
                values[f.name] = {k: torch.cat([p.forward_inputs[k] for p in parts], dim=1)
                                  for k in parts[0].forward_inputs}
            elif f.name != "obs_moments":
                dim = 0 if f.name == "next_values" else 1
                values[f.name] = torch.cat([getattr(p, f.name) for p in parts], dim=dim)
        return cls(**values)

    def split(self, num_shards: int) -> List["Trajectory"]:
        """Split along the env dimension into ``num_shards`` equal parts (one per actor rank)."""
        if self.num_envs % num_shards:
            raise ValueError(f"{self.num_envs} envs do not split into {num_shards} actor shards")
        size = self.num_envs // num_shards
        shards = []
        for i in range(num_shards):
            sl = slice(i * size, (i + 1) * size)
            per_env = {f.name: getattr(self, f.name)[:, sl] for f in dataclasses.fields(self)
                       if f.name not in ("forward_inputs", "next_values", "obs_moments")}
            shards.append(dataclasses.replace(
                self, forward_inputs={k: v[:, sl] for k, v in self.forward_inputs.items()},
                next_values=self.next_values[sl], **per_env))
        return shards


@dataclass
class WeightMessage:
    """Actor -> rollout: new weights (trainable parameters and the observation statistics), the
    version they carry, and per pipeline stage of the receiving rollout rank how many of its
    trajectories the actor has consumed or dropped so far (the rollout's throttle)."""

    version: int
    state_dict: Dict[str, Any]
    acknowledged: Dict[int, int] = field(default_factory=dict)
