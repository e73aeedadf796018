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

With ``algorithm.staleness_control: kl`` the threshold moves during the run
(``StalenessController``): the actor decides it after each update from the measured behaviour KL
and sends it with the weights; the rollout throttles the trajectories it starts from then on by it,
and the store judges each trajectory by the bound sent with its version (the one it was started
under), so the argument above holds per trajectory. Queues are sized for the highest bound the run
may reach (``max_capacity``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional, Sequence

import torch


@dataclass(frozen=True)
class VersionGate:
    """The gate, from ``algorithm``'s settings passed as they are: their defaults live in the
    schema, their bounds in ``config.validate`` (checked once, at start-up)."""

    size_per_stream: int  # algorithm.rollout_store_size_per_rank (>= 1)
    staleness_threshold: int  # algorithm.staleness_threshold (>= 0): the bound in force
    on_policy_min_ratio: float  # algorithm.on_policy_min_ratio (in [0, 1])
    # the highest bound of the run: staleness_threshold itself, or algorithm.staleness_max when the
    # bound follows the behaviour KL
    max_threshold: Optional[int] = None

    @classmethod
    def from_config(cls, algorithm) -> "VersionGate":
        controlled = algorithm.staleness_control == "kl"
        threshold = StalenessController.from_config(algorithm).threshold if controlled \
            else algorithm.staleness_threshold
        return cls(algorithm.rollout_store_size_per_rank, threshold, algorithm.on_policy_min_ratio,
                   algorithm.staleness_max if controlled else threshold)

    def with_threshold(self, threshold: int) -> "VersionGate":
        """The same gate under another bound (never above ``highest``)."""
        if not 0 <= threshold <= self.highest:
            raise ValueError(f"staleness bound {threshold} outside [0, {self.highest}]")
        return replace(self, staleness_threshold=int(threshold))

    @property
    def highest(self) -> int:
        return self.staleness_threshold if self.max_threshold is None else self.max_threshold

    @property
    def capacity(self) -> int:
        """Trajectories one stream may have unacknowledged under the bound in force."""
        return self.size_per_stream * (self.staleness_threshold + 1)

    @property
    def max_capacity(self) -> int:
        """The most trajectories one stream may ever have unacknowledged: its queue's depth."""
        return self.size_per_stream * (self.highest + 1)

    @property
    def fresh_needed(self) -> int:
        """Lag-0 trajectories each stream contributes to an update (rounding guard: 0.5 x 2 is 1)."""
        return math.ceil(self.on_policy_min_ratio * self.size_per_stream - 1e-9)

    def may_start(self, started: int, acknowledged: int) -> bool:
        """The rollout's throttle: may a stream that began ``started`` trajectories, of which the
        actor acknowledged ``acknowledged``, begin another?"""
        return started - acknowledged < self.capacity

    def accepts(self, actor_version: int, trajectory_version: int, bound: Optional[int] = None) -> bool:
        """May the actor at ``actor_version`` still train on data of ``trajectory_version``, started
        under ``bound`` (the bound in force by default)?"""
        limit = self.staleness_threshold if bound is None else bound
        return actor_version - trajectory_version <= limit


@dataclass
class StalenessController:
    """``algorithm.staleness_control: kl``: the staleness bound follows the behaviour KL.

    The practitioners' rule for async PPO (RLinf's tuning notes; AReaL's and slime's fixed bounds
    leave it to the user): a behaviour KL (behaviour vs proximal policy, ``-mean(log r)`` over the
    trained samples) under ~0.01 costs nothing, above ~0.03 the stale samples hurt. The controller
    closes that loop: after ``patience`` updates in a row below ``kl_low`` it raises the bound by
    one (more overlap, more throughput), after ``patience`` in a row above ``kl_high`` it lowers it
    by one; inside the band it holds (the band is the hysteresis). It judges only updates whose
    trajectories were all started under the bound in force (``settled``): after a change, the data
    already in flight still shows the old lag for up to ``bound + 1`` updates, and counting it
    would move the bound again before its effect shows (overshoot). A bound that
    had to be lowered is raised to again only after twice the wait of the time before (up to
    ``MAX_BACKOFF`` x ``patience``): where no bound reads inside the band (lag 0 under it, lag 1 over
    it) the bound dwells ever longer at the lower one instead of swinging every few updates. The
    bound stays in ``[minimum, maximum]``. Every actor rank observes the same rank-averaged KL, so
    all decide alike. An update without the measurement (no ratio, or non-finite) leaves it as is.
    """

    MAX_BACKOFF = 16

    threshold: int
    minimum: int
    maximum: int
    kl_low: float
    kl_high: float
    patience: int
    below: int = 0  # updates in a row with the KL under kl_low
    above: int = 0  # ... over kl_high
    # per bound: how often it was lowered from (its KL read too high)
    lowered_from: Dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, algorithm) -> "StalenessController":
        start = min(max(algorithm.staleness_threshold, algorithm.staleness_min), algorithm.staleness_max)
        return cls(start, algorithm.staleness_min, algorithm.staleness_max, algorithm.staleness_kl_low,
                   algorithm.staleness_kl_high, algorithm.staleness_kl_patience)

    def observe(self, behaviour_kl: Optional[float], settled: bool = True) -> int:
        """One update's measured behaviour KL in (``settled``: its trajectories were all started
        under the bound in force), the bound for the next updates out."""
        if not settled or behaviour_kl is None or not math.isfinite(behaviour_kl):
            return self.threshold
        self.below = self.below + 1 if behaviour_kl < self.kl_low else 0
        self.above = self.above + 1 if behaviour_kl > self.kl_high else 0
        if self.above >= self.patience and self.threshold > self.minimum:
            self.lowered_from[self.threshold] = self.lowered_from.get(self.threshold, 0) + 1
            self._move(-1)
        elif self.below >= self.raise_patience() and self.threshold < self.maximum:
            self._move(1)
        return self.threshold

    def raise_patience(self) -> int:
        """Updates in a row under ``kl_low`` before the bound rises to the next one."""
        failures = self.lowered_from.get(self.threshold + 1, 0)
        return self.patience * min(2 ** failures, self.MAX_BACKOFF)

    def _move(self, step: int) -> None:
        self.threshold += step
        self.below = self.above = 0

    def state(self) -> Dict[str, Any]:
        """What a checkpoint keeps, so a resumed run goes on with the same bound and counts."""
        return {"staleness_threshold": self.threshold, "staleness_below": self.below,
                "staleness_above": self.above, "staleness_lowered_from": dict(self.lowered_from)}

    def restore(self, state: Dict[str, Any]) -> None:
        if "staleness_threshold" in state:  # a checkpoint of a fixed-bound run starts it afresh
            self.threshold = min(max(int(state["staleness_threshold"]), self.minimum), self.maximum)
            self.below, self.above = int(state["staleness_below"]), int(state["staleness_above"])
            self.lowered_from = {int(k): int(v) for k, v in state["staleness_lowered_from"].items()}


def staleness(versions: torch.Tensor, current_version: int) -> int:
    """How many versions behind ``current_version`` the oldest step of ``versions`` is: the lag the
    gate judges a trajectory by (``accepts``), and the rollout store records."""
    return int(current_version) - int(versions.min().item())


def mean_staleness(trajectories: Sequence[torch.Tensor], current_version: int) -> float:
    """The gate's lag (``staleness``), one per trajectory (its steps' ``versions``), averaged over
    ``trajectories``: ``train/actor/staleness`` of an update. 0 for none."""
    lags = [staleness(versions, current_version) for versions in trajectories]
    return sum(lags) / len(lags) if lags else 0.0
