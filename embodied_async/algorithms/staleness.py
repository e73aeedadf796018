"""Off-policy staleness bookkeeping for async rollouts (pure torch)."""

from __future__ import annotations

import torch


def staleness(versions: torch.Tensor, current_version: int) -> int:
    """How many versions behind the oldest step of a rollout is.

    Args:
        versions: int tensor (e.g. [T, B]) of per-step policy versions.
        current_version: the trainer's current policy version.
    """
    return int(current_version) - int(versions.min().item())


def is_fresh(versions: torch.Tensor, current_version: int, threshold: int) -> bool:
    """True when staleness(versions, current_version) <= threshold."""
    return staleness(versions, current_version) <= threshold


class StalenessFilter:
    """Drops rollouts older than `threshold` versions and counts outcomes."""

    def __init__(self, threshold: int):
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = threshold
        self._reset()

    def _reset(self) -> None:
        self.num_accepted = 0
        self.num_dropped = 0
        self.max_staleness_seen = 0

    def accept(self, versions: torch.Tensor, current_version: int) -> bool:
        """Return True if the rollout is fresh enough to train on."""
        lag = staleness(versions, current_version)
        # Track the lag of every rollout seen, dropped ones included, so the
        # metric shows how far behind the rollout workers are running.
        self.max_staleness_seen = max(self.max_staleness_seen, lag)
        if lag <= self.threshold:
            self.num_accepted += 1
            return True
        self.num_dropped += 1
        return False

    def pop_metrics(self) -> dict[str, int]:
        """Counts since the last pop; resets them."""
        metrics = {
            "dropped_trajectories": self.num_dropped,
            "accepted_trajectories": self.num_accepted,
            "max_staleness": self.max_staleness_seen,
        }
        self._reset()
        return metrics
