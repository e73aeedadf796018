"""The actor's rollout store: which trajectories an update trains on (pure Python, no Ray).

Seed: RLinf's Async PPO (``rollout_store_size_per_rank``, ``on_policy_min_ratio``).

A *stream* is one pipeline stage of one env worker, as its rollout rank serves it
(``Topology.streams``); each produces trajectories in order, and every
actor rank receives its shard of each one. An update takes ``size_per_stream`` version-valid
trajectories from every stream, of which at least ``ceil(on_policy_min_ratio x size_per_stream)``
come from the actor's current version (lag 0).

The store decides only from the trajectories' versions and the order they arrived in, never from
timing, so every actor rank, fed the same streams, keeps, drops and trains on the same ones.
What is too stale, and how many fresh ones an update needs, is the version gate's rule
(``version_gate.VersionGate``); the rollout's throttle follows the same gate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence

from embodied_async.algorithms.version_gate import VersionGate


@dataclass
class StoredTrajectory:
    item: Any  # this rank's shard of the trajectory
    version: int  # the oldest step's policy version
    bound: int  # the most versions it may lag: the staleness bound it was started under


@dataclass
class StoreMetrics:
    """Counts since the last update (``pop``)."""

    lag_counts: Dict[int, int] = field(default_factory=dict)  # trajectories trained on, per lag
    dropped: int = 0  # too stale (lag > threshold) when their turn came
    waited_for_fresh: int = 0  # extra trajectories pulled because too few were on-policy


class RolloutStore:
    """Per-stream FIFO queues of trajectories and the rule that picks an update's batch."""

    def __init__(self, streams: Sequence[Hashable], gate: VersionGate):
        self.streams = list(streams)
        self.gate = gate
        self.size = gate.size_per_stream
        self.queues: Dict[Hashable, Deque[StoredTrajectory]] = {s: deque() for s in self.streams}
        # per stream: trajectories consumed or dropped since the start (the rollout's throttle)
        self.acknowledged: Dict[Hashable, int] = {s: 0 for s in self.streams}
        self.metrics = StoreMetrics()

    def add(self, stream: Hashable, item: Any, version: int, bound: Optional[int] = None) -> None:
        """``bound``: the staleness bound the rollout started the trajectory under (the gate's by
        default). A bound that moves (``StalenessController``) judges each trajectory by its own:
        the throttle admitted it under that bound, so judging it by a lower one set since would
        drop data the rollout cannot replace until the next acknowledgement (a deadlock)."""
        bound = self.gate.staleness_threshold if bound is None else int(bound)
        self.queues[stream].append(StoredTrajectory(item, int(version), bound))

    def _drop_stale(self, version: int) -> None:
        for stream, queue in self.queues.items():
            kept = deque(t for t in queue if self.gate.accepts(version, t.version, t.bound))
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
        num_fresh = max(self.gate.fresh_needed, self.size - len(stale))
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
        """Per update: trajectories per lag (0 to the run's highest bound, always present), the max
        lag trained on, drops and waits for fresh data since the last pop."""
        m, self.metrics = self.metrics, StoreMetrics()
        prefix = "train/rollout_store/"
        out = {f"{prefix}trajectories_lag_{lag}": float(m.lag_counts.get(lag, 0))
               for lag in range(self.gate.highest + 1)}
        out[f"{prefix}max_lag"] = float(max(m.lag_counts, default=0))
        out[f"{prefix}dropped_trajectories"] = float(m.dropped)
        out[f"{prefix}waited_for_fresh"] = float(m.waited_for_fresh)
        out[f"{prefix}held_trajectories"] = float(self.held())
        return out
