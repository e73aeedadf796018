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
