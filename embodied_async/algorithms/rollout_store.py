"""The actor's rollout store: which trajectories an update trains on (pure Python, no Ray).

Seed: RLinf's Async PPO (``rollout_store_size_per_rank``, ``on_policy_min_ratio``).

A *stream* is one pipeline stage of one env worker, as its rollout rank serves it
(``Topology.streams``); each produces trajectories in order, and every
actor rank receives its shard of each one. An update takes ``size_per_stream x streams``
version-valid trajectories, of which at least ``ceil(on_policy_min_ratio x size_per_stream)`` per
stream's share come from the actor's current version (lag 0), chosen by ``algorithm.batch_from``:

- ``every_stream``: ``size_per_stream`` from every stream. The store decides from the versions and
  each stream's order alone, so every actor rank, fed the same streams, keeps, drops and trains on
  the same ones without talking to the others. A slow env worker holds every update up.
- ``first_arrived``: the first to arrive, from any streams (older ones first, as above). A slow
  worker no longer holds the updates up: the others fill its share, and its trajectories train
  when they come (or are dropped, when the updates made meanwhile left them beyond the bound).
  Arrival order is timing, so actor rank 0 pulls the trajectories and tells the other ranks in
  which order it did (``ActorWorker._collect``); they pull their shards in that order.
What is too stale, and how many fresh ones an update needs, is the version gate's rule
(``version_gate.VersionGate``); the rollout's throttle follows the same gate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence, Tuple

from embodied_async.algorithms.version_gate import VersionGate

BATCH_FROM = ("every_stream", "first_arrived")  # algorithm.batch_from


@dataclass
class StoredTrajectory:
    item: Any  # this rank's shard of the trajectory
    version: int  # the oldest step's policy version
    bound: int  # the most versions it may lag: the staleness bound it was started under
    arrival: int  # its place in the order the store received trajectories


@dataclass
class StoreMetrics:
    """Counts since the last update (``pop``)."""

    lag_counts: Dict[int, int] = field(default_factory=dict)  # trajectories trained on, per lag
    dropped: int = 0  # too stale (lag > threshold) when their turn came
    waited_for_fresh: int = 0  # extra trajectories pulled because too few were on-policy
    fewest_from_one_stream: int = 0  # of the last batch: under first_arrived, 0 where a stream was late


class RolloutStore:
    """Per-stream FIFO queues of trajectories and the rule that picks an update's batch."""

    # what stream_to_wait_for names when any stream's next trajectory would do (first_arrived)
    ANY_STREAM = "any stream"

    def __init__(self, streams: Sequence[Hashable], gate: VersionGate, batch_from: str = "every_stream"):
        if batch_from not in BATCH_FROM:
            raise ValueError(f"batch_from={batch_from!r} is not one of {BATCH_FROM}")
        self.streams = list(streams)
        self.gate = gate
        self.size = gate.size_per_stream
        self.first_arrived = batch_from == "first_arrived"
        self.arrivals = 0
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
        self.queues[stream].append(StoredTrajectory(item, int(version), bound, self.arrivals))
        self.arrivals += 1

    def _drop_stale(self, version: int) -> None:
        for stream, queue in self.queues.items():
            kept = deque(t for t in queue if self.gate.accepts(version, t.version, t.bound))
            dropped = len(queue) - len(kept)
            if dropped:
                self.queues[stream] = kept
                self.acknowledged[stream] += dropped
                self.metrics.dropped += dropped

    @staticmethod
    def _choose(entries: List[tuple], version: int, size: int, fresh_needed: int) -> Optional[List[tuple]]:
        """Of ``entries`` ((key, trajectory) in arrival order), the ``size`` an update takes, or None
        while too few are fresh. Older trajectories go first (they would go stale next), but only
        as many as leave room for the fresh ones the on-policy ratio asks for."""
        stale = [e for e in entries if e[1].version < version]
        fresh = [e for e in entries if e[1].version >= version]
        num_fresh = max(fresh_needed, size - len(stale))
        if len(fresh) < num_fresh:
            return None
        return stale[:size - num_fresh] + fresh[:num_fresh]

    def _batch(self, version: int) -> Optional[Dict[Hashable, List[int]]]:
        """Per stream, the indices (arrival order) of the update's trajectories; None while the
        store cannot fill the batch yet."""
        if self.first_arrived:
            entries = sorted((((s, i), t) for s, queue in self.queues.items() for i, t in enumerate(queue)),
                             key=lambda e: e[1].arrival)
            chosen = self._choose(entries, version, self.size * len(self.streams),
                                  self.gate.fresh_needed * len(self.streams))
            if chosen is None:
                return None
            batch: Dict[Hashable, List[int]] = {s: [] for s in self.streams}
            for (stream, index), _ in chosen:
                batch[stream].append(index)
            return {s: sorted(indices) for s, indices in batch.items()}
        batch = {}
        for stream in self.streams:
            chosen = self._stream_share(stream, version)
            if chosen is None:
                return None
            batch[stream] = sorted(index for index, _ in chosen)
        return batch

    def _stream_share(self, stream: Hashable, version: int) -> Optional[List[tuple]]:
        """every_stream: (index, trajectory) of the stream's share of the batch, or None."""
        return self._choose(list(enumerate(self.queues[stream])), version, self.size, self.gate.fresh_needed)

    def stream_to_wait_for(self, version: int) -> Optional[Hashable]:
        """What the batch waits for: the first stream (in fixed order) whose share is not complete
        yet (every_stream), or ``ANY_STREAM`` (first_arrived); None when the batch is complete.

        Drops what went stale first. A store that holds enough trajectories, but too few fresh
        ones, counts a wait for fresh data.
        """
        self._drop_stale(version)
        if self.first_arrived:
            if self._batch(version) is not None:
                return None
            if self.held() >= self.size * len(self.streams):
                self.metrics.waited_for_fresh += 1
            return self.ANY_STREAM
        for stream in self.streams:
            if self._stream_share(stream, version) is None:
                if len(self.queues[stream]) >= self.size:
                    self.metrics.waited_for_fresh += 1
                return stream
        return None

    def take(self, version: int) -> List[Any]:
        """Remove and return the update's batch: every_stream's by stream in fixed order, arrival
        order within; first_arrived's in arrival order."""
        self._drop_stale(version)
        chosen_of = self._batch(version)
        if chosen_of is None:
            raise RuntimeError("take() before the store holds a complete batch")
        taken = []
        self.metrics.fewest_from_one_stream = min(len(chosen) for chosen in chosen_of.values())
        for stream in self.streams:
            chosen = set(chosen_of[stream])
            queue = self.queues[stream]
            for i, stored in enumerate(queue):
                if i in chosen:
                    taken.append(stored)
                    lag = version - stored.version
                    self.metrics.lag_counts[lag] = self.metrics.lag_counts.get(lag, 0) + 1
            self.queues[stream] = deque(t for i, t in enumerate(queue) if i not in chosen)
            self.acknowledged[stream] += len(chosen)
        if self.first_arrived:
            taken.sort(key=lambda t: t.arrival)
        return [stored.item for stored in taken]

    def held(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def accounted(self, stream: Hashable) -> Tuple[int, int]:
        """``(acknowledged, held)`` of ``stream``, read in that order while another thread may
        train: a trajectory moving from held to acknowledged meanwhile is missed, never counted
        twice (a throttle starting from the sum can only be looser)."""
        acknowledged = self.acknowledged[stream]
        return acknowledged, len(self.queues[stream])

    def pop_metrics(self) -> Dict[str, float]:
        """Per update: trajectories per lag (0 to the run's highest bound, always present), the max
        lag trained on, drops and waits for fresh data since the last pop, and the fewest
        trajectories one stream gave the batch."""
        m, self.metrics = self.metrics, StoreMetrics()
        prefix = "train/rollout_store/"
        out = {f"{prefix}trajectories_lag_{lag}": float(m.lag_counts.get(lag, 0))
               for lag in range(self.gate.highest + 1)}
        out[f"{prefix}max_lag"] = float(max(m.lag_counts, default=0))
        out[f"{prefix}dropped_trajectories"] = float(m.dropped)
        out[f"{prefix}waited_for_fresh"] = float(m.waited_for_fresh)
        out[f"{prefix}fewest_from_one_stream"] = float(m.fewest_from_one_stream)
        out[f"{prefix}held_trajectories"] = float(self.held())
        return out
