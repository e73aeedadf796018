"""The actor's rollout store: which trajectories an update trains on (pure Python, no Ray).

Seed: RLinf's Async PPO (``rollout_store_size_per_rank``, ``on_policy_min_ratio``).

A *stream* is one rollout rank x pipeline stage; each produces trajectories in order, and every
actor rank receives its shard of each one. An update takes ``size_per_stream`` version-valid
trajectories from every stream, of which at least ``ceil(on_policy_min_ratio x size_per_stream)``
come from the actor's current version (lag 0).

The store decides only from the trajectories' versions and the order they arrived in, never from
timing, so every actor rank, fed the same streams, keeps, drops and trains on the same ones.
A trajectory's version is that of its oldest step (a rollout may swap weights mid-trajectory);
its lag is ``actor version - that``. One older than ``staleness_threshold`` versions is dropped.

The rollout's throttle (see ``rollout_capacity``) counts what the actor acknowledged (consumed
or dropped), so a dropped trajectory frees its slot instead of desynchronising the two.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence


def rollout_capacity(size_per_stream: int, staleness_threshold: int) -> int:
    """How many unacknowledged trajectories one stream may have in flight.

    Acknowledgements arrive with new weights, ``size_per_stream`` per update. A trajectory started
    with ``n`` others unacknowledged is trained on at most ``n // size_per_stream`` updates later,
    so ``n < size_per_stream x (threshold + 1)`` keeps its lag within the threshold (in sync mode,
    exactly one update's worth is collected, then the rollout waits for the new weights).
    """
    return size_per_stream * (staleness_threshold + 1)


@dataclass
class StoredTrajectory:
    item: Any  # this rank's shard of the trajectory
    version: int  # the oldest step's policy version


@dataclass
class StoreMetrics:
    """Counts since the last update (``pop``)."""

    lag_counts: Dict[int, int] = field(default_factory=dict)  # trajectories trained on, per lag
    dropped: int = 0  # too stale (lag > threshold) when their turn came
    waited_for_fresh: int = 0  # extra trajectories pulled because too few were on-policy


class RolloutStore:
    """Per-stream FIFO queues of trajectories and the rule that picks an update's batch."""

    def __init__(self, streams: Sequence[Hashable], size_per_stream: int, staleness_threshold: int,
                 on_policy_min_ratio: float = 0.0):
        if size_per_stream < 1:
            raise ValueError(f"size_per_stream must be >= 1, got {size_per_stream}")
        if staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {staleness_threshold}")
        if not 0.0 <= on_policy_min_ratio <= 1.0:
            raise ValueError(f"on_policy_min_ratio must be in [0, 1], got {on_policy_min_ratio}")
        self.streams = list(streams)
        self.size = size_per_stream
        self.threshold = staleness_threshold
        # rounding guard: 0.5 x 2 must need exactly 1, not 2 after float error
        self.fresh_needed = math.ceil(on_policy_min_ratio * size_per_stream - 1e-9)
        self.queues: Dict[Hashable, Deque[StoredTrajectory]] = {s: deque() for s in self.streams}
        # per stream: trajectories consumed or dropped since the start (the rollout's throttle)
        self.acknowledged: Dict[Hashable, int] = {s: 0 for s in self.streams}
        self.metrics = StoreMetrics()

    def add(self, stream: Hashable, item: Any, version: int) -> None:
        self.queues[stream].append(StoredTrajectory(item, int(version)))

    def _drop_stale(self, version: int) -> None:
        for stream, queue in self.queues.items():
            kept = deque(t for t in queue if version - t.version <= self.threshold)
            dropped = len(queue) - len(kept)
            if dropped:
                self.queues[stream] = kept
                self.acknowledged[stream] += dropped
                self.metrics.dropped += dropped

    def _pick(self, stream: Hashable, version: int) -> Optional[List[int]]:
        """Indices (arrival order) of this stream's batch, or None while it needs more data.

        Older trajectories go first (they would go stale next), but only as many as leave room
        for the fresh ones the on-policy ratio asks for.
        """
        queue = self.queues[stream]
        stale = [i for i, t in enumerate(queue) if t.version < version]
        fresh = [i for i, t in enumerate(queue) if t.version >= version]
        num_fresh = max(self.fresh_needed, self.size - len(stale))
        if len(fresh) < num_fresh:
            return None
        return sorted(stale[:self.size - num_fresh] + fresh[:num_fresh])

    def stream_to_wait_for(self, version: int) -> Optional[Hashable]:
        """The first stream (in fixed order) whose batch is not complete yet; None when all are.

        Drops what went stale first. A stream that holds enough trajectories, but too few fresh
        ones, counts a wait for fresh data.
        """
        self._drop_stale(version)
        for stream in self.streams:
            if self._pick(stream, version) is None:
                if len(self.queues[stream]) >= self.size:
                    self.metrics.waited_for_fresh += 1
                return stream
        return None

    def take(self, version: int) -> List[Any]:
        """Remove and return the update's batch: streams in fixed order, arrival order within."""
        if self.stream_to_wait_for(version) is not None:
            raise RuntimeError("take() before the store holds a complete batch")
        batch = []
        for stream in self.streams:
            chosen = set(self._pick(stream, version))
            queue = self.queues[stream]
            for i, stored in enumerate(queue):
                if i in chosen:
                    batch.append(stored.item)
                    lag = version - stored.version
                    self.metrics.lag_counts[lag] = self.metrics.lag_counts.get(lag, 0) + 1
            self.queues[stream] = deque(t for i, t in enumerate(queue) if i not in chosen)
            self.acknowledged[stream] += len(chosen)
        return batch

    def held(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def pop_metrics(self) -> Dict[str, float]:
        """Per update: trajectories per lag (0..threshold, always present), the max lag trained
        on, drops and waits for fresh data since the last pop."""
        m, self.metrics = self.metrics, StoreMetrics()
        out = {f"trajectories_lag_{lag}": float(m.lag_counts.get(lag, 0)) for lag in range(self.threshold + 1)}
        out["max_lag"] = float(max(m.lag_counts, default=0))
        out["dropped_trajectories"] = float(m.dropped)
        out["waited_for_fresh"] = float(m.waited_for_fresh)
        out["held_trajectories"] = float(self.held())
        return out
