"""Statistics over seeds for the benchmarks: a mean with its bootstrap interval, and the ratio of
two arms' means over paired seeds (seed k of one arm resampled with seed k of the other)."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np


def bootstrap_mean(values: Sequence[float], draws: int = 10_000, seed: int = 0) -> Dict:
    """The mean of ``values`` with a percentile bootstrap 95 % interval (resampling the values)."""
    values = np.asarray(values, dtype=np.float64)
    means = np.random.default_rng(seed).choice(values, size=(draws, len(values))).mean(axis=1)
    return {"mean": round(float(values.mean()), 4), "ci95": [round(float(np.percentile(means, 2.5)), 4),
                                                             round(float(np.percentile(means, 97.5)), 4)],
            "n": int(len(values))}


def ratio_of_means(arm: Sequence[float], base: Sequence[float], resamples: int = 10_000, seed: int = 0) -> Dict:
    """mean(arm) / mean(base) over paired seeds, with a percentile bootstrap 95 % interval
    (the same seeds resampled for both)."""
    arm, base = np.asarray(arm, float), np.asarray(base, float)
    if arm.shape != base.shape or arm.size == 0:
        raise ValueError("the ratio needs the same seeds, at least one, in both arms")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, arm.size, size=(resamples, arm.size))
    ratios = arm[index].mean(1) / base[index].mean(1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return {"ratio": round(float(arm.mean() / base.mean()), 3), "low": round(float(low), 3),
            "high": round(float(high), 3)}
