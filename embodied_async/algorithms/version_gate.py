"""The version gate: the one rule, from versions alone, for how stale trained data may be.

Every trajectory carries the policy version of its oldest step; its *lag* is the actor's version
minus that (``staleness``; ``train/actor/staleness`` is its mean over an update's trajectories,
``mean_staleness``). Three places follow the rule written here:

- the actor's rollout store drops a trajectory whose lag exceeds ``staleness_threshold`` and
  takes ``size_per_stream`` trajectories per stream for each update, at least
  ``fresh_needed`` of them with lag 0 (``on_policy_min_ratio``);
- the rollout starts a trajectory only while fewer than ``capacity`` of its stream's trajectories
  are unacknowledged by the actor (``may_start``);
- the runner sizes each trajectory queue to ``capacity`` (a full queue is backpressure on top).

Why ``capacity = size_per_stream x (threshold + 1)`` bounds the lag: acknowledgements (consumed or
dropped trajectories) arrive with new weights, ``size_per_stream`` per update. A trajectory
started with ``n`` others unacknowledged is trained on at most ``n // size_per_stream`` updates
later, so ``n < capacity`` keeps its lag within the threshold. With threshold 0 (synchronous PPO)
exactly one update's worth is collected, then the rollout waits for the new weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class VersionGate:
    """The gate, from ``algorithm``'s settings passed as they are: their defaults live in the
    schema, their bounds in ``config.validate`` (checked once, at start-up)."""

    size_per_stream: int  # algorithm.rollout_store_size_per_rank (>= 1)
    staleness_threshold: int  # algorithm.staleness_threshold (>= 0)
    on_policy_min_ratio: float  # algorithm.on_policy_min_ratio (in [0, 1])

    @classmethod
    def from_config(cls, algorithm) -> "VersionGate":
        return cls(algorithm.rollout_store_size_per_rank, algorithm.staleness_threshold,
                   algorithm.on_policy_min_ratio)

    @property
    def capacity(self) -> int:
        """Trajectories one stream may have unacknowledged (and its queue's depth)."""
        return self.size_per_stream * (self.staleness_threshold + 1)

    @property
    def fresh_needed(self) -> int:
        """Lag-0 trajectories each stream contributes to an update (rounding guard: 0.5 x 2 is 1)."""
        return math.ceil(self.on_policy_min_ratio * self.size_per_stream - 1e-9)

    def may_start(self, started: int, acknowledged: int) -> bool:
        """The rollout's throttle: may a stream that began ``started`` trajectories, of which the
        actor acknowledged ``acknowledged``, begin another?"""
        return started - acknowledged < self.capacity

    def accepts(self, actor_version: int, trajectory_version: int) -> bool:
        """May the actor at ``actor_version`` still train on data of ``trajectory_version``?"""
        return actor_version - trajectory_version <= self.staleness_threshold


def staleness(versions: torch.Tensor, current_version: int) -> int:
    """How many versions behind ``current_version`` the oldest step of ``versions`` is: the lag the
    gate judges a trajectory by (``accepts``), and the rollout store records."""
    return int(current_version) - int(versions.min().item())


def mean_staleness(trajectories: Sequence[torch.Tensor], current_version: int) -> float:
    """The gate's lag (``staleness``), one per trajectory (its steps' ``versions``), averaged over
    ``trajectories``: ``train/actor/staleness`` of an update. 0 for none."""
    lags = [staleness(versions, current_version) for versions in trajectories]
    return sum(lags) / len(lags) if lags else 0.0
