"""Learning-rate schedules: a multiplier of the base rate per optimiser step."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float) -> float:
    """Linear warm-up from ~0 to 1 over ``warmup_steps``, then 1 ("constant") or a cosine down to
    ``min_ratio`` at ``total_steps`` ("cosine"). ``step`` counts from 0 (the first step's rate)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use 'cosine' or 'constant'")
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
