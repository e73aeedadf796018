"""Feature statistics as LeRobot's ``meta/stats.json`` and per-episode ``stats/...`` columns hold
them: ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantiles ``q01`` .. ``q99``.

Vectors have one value per dimension; images one per channel, shaped ``[3, 1, 1]`` and taken on
pixels scaled to [0, 1]. A dataset's statistics are its episodes' merged: counts add, means are
weighted, variances combine exactly (parallel rule), quantiles are count-weighted means of the
episodes' quantiles (an approximation, the one LeRobot makes too).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILES)
MAX_IMAGE_FRAMES = 100  # frames of an episode sampled for image statistics
MAX_IMAGE_SIDE = 64  # images are strided down to about this side for them


def feature_stats(values: np.ndarray, is_image: bool) -> Dict[str, np.ndarray]:
    """Statistics of one episode's values: ``[T, D]`` / ``[T]`` numbers or uint8 ``[T, H, W, 3]``."""
    values = np.asarray(values)
    count = np.array([values.shape[0]], dtype=np.int64)
    if is_image:
        step = max(1, values.shape[0] // MAX_IMAGE_FRAMES)
        stride = max(1, max(values.shape[1:3]) // MAX_IMAGE_SIDE)
        pixels = values[::step, ::stride, ::stride].reshape(-1, values.shape[-1]).astype(np.float64) / 255.0
        shape = (values.shape[-1], 1, 1)
        stats = {k: v.reshape(shape) for k, v in _columns(pixels).items()}
        return _ordered({**stats, "count": count})
    flat = values.reshape(values.shape[0], -1)
    stats = _columns(flat.astype(np.float64))
    if np.issubdtype(values.dtype, np.integer):  # LeRobot keeps integer bounds integers
        stats["min"], stats["max"] = flat.min(axis=0), flat.max(axis=0)
    return _ordered({**stats, "count": count})


def _ordered(stats: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """In LeRobot's order (the columns of ``meta/episodes`` follow it)."""
    return {name: stats[name] for name in STAT_NAMES}


def _columns(x: np.ndarray) -> Dict[str, np.ndarray]:
    out = {"min": x.min(axis=0), "max": x.max(axis=0), "mean": x.mean(axis=0), "std": x.std(axis=0)}
    for name, q in QUANTILES.items():
        out[name] = np.quantile(x, q, axis=0)
    return out


def merge_stats(parts: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """One feature's statistics over several episodes (or datasets)."""
    if not parts:
        raise ValueError("no statistics to merge")
    counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
    weights = counts / counts.sum()
    shape = (len(parts),) + (1,) * np.asarray(parts[0]["mean"]).ndim
    w = weights.reshape(shape)
    means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
    stds = np.stack([np.asarray(p["std"], dtype=np.float64) for p in parts])
    mean = (w * means).sum(axis=0)
    var = (w * (stds ** 2 + (means - mean) ** 2)).sum(axis=0)
    out = {"min": np.min(np.stack([np.asarray(p["min"]) for p in parts]), axis=0),
           "max": np.max(np.stack([np.asarray(p["max"]) for p in parts]), axis=0),
           "mean": mean, "std": np.sqrt(var), "count": np.array([int(counts.sum())], dtype=np.int64)}
    for name in QUANTILES:
        out[name] = (w * np.stack([np.asarray(p[name], dtype=np.float64) for p in parts])).sum(axis=0)
    return _ordered(out)


def to_json(stats: Dict[str, Dict[str, np.ndarray]]) -> Dict[str, Dict[str, list]]:
    return {key: {name: np.asarray(value).tolist() for name, value in feature.items()}
            for key, feature in stats.items()}


def from_json(data: Dict[str, Dict[str, list]]) -> Dict[str, Dict[str, np.ndarray]]:
    return {key: {name: np.asarray(value) for name, value in feature.items()} for key, feature in data.items()}
