"""The graph's four channels and how each key travels: point to point where its two processes
share a node (``DirectChannel``), through a Ray channel actor otherwise (``RoutedChannel`` mixes
the two per key), in process for the local backend."""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Hashable, Optional, Sequence, Tuple

from embodied_async.scheduler.channel import ChannelFuture, RayChannel, Shared, create_channel
from embodied_async.scheduler.direct_channel import DirectChannel

__all__ = ["GraphChannels", "LateDelivery", "RoutedChannel"]


@dataclass
class GraphChannels:
    """The four channels of the graph, one message type each (``embodied_async.data``):

    - ``env_outputs``: env -> rollout ``EnvOutput``, keyed ``(env rank, stage)``;
    - ``actions``: rollout -> env ``ActionMessage``, keyed ``(env rank, stage)``;
    - ``trajectories``: rollout -> actor ``Trajectory`` shards, keyed ``(rollout rank, stream,
      actor rank)`` (a stream: one stage of one env worker the rollout rank serves,
      ``Topology.stream_env_keys``), each as deep as the version gate lets a stream run ahead;
    - ``weights``: actor -> rollout ``WeightMessage``, keyed by rollout rank.
    """

    env_outputs: Any
    actions: Any
    trajectories: Any
    weights: Any

    @classmethod
    def create(cls, backend: str, trajectory_depth: int,
               links: Optional[Dict[str, Tuple[Sequence[Hashable], Sequence[Hashable]]]] = None,
               latency_s: Optional[Dict[str, float]] = None) -> "GraphChannels":
        """``links``: per channel name, every key it will carry and those of them whose producer
        and consumer share a node. Under Ray those keys go point to point (``DirectChannel``: a
        Unix socket, no process in between), the others through a channel actor; a channel not
        in ``links`` goes through a channel actor. ``latency_s`` (a drill,
        ``cluster.inject_channel_latency_s``): per channel name, how much later every item on it
        reaches its consumer."""
        run_id = uuid.uuid4().hex[:8]  # Ray channel actors are named: keep runs in one session apart
        depths = {"env_outputs": 2, "actions": 2, "trajectories": trajectory_depth, "weights": 0}
        channels = {}
        for name, depth in depths.items():
            if backend == "ray" and links and name in links:
                channels[name] = _linked_channel(f"{name}-{run_id}", depth, *links[name])
            else:
                channels[name] = create_channel(backend, f"{name}-{run_id}", maxsize=depth)
            if (latency_s or {}).get(name, 0) > 0:
                channels[name] = LateDelivery(channels[name], latency_s[name])
        return cls(**channels)

    def named(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _linked_channel(name: str, maxsize: int, keys: Sequence[Hashable], direct_keys: Sequence[Hashable]):
    direct = [key for key in keys if key in set(direct_keys)]
    if direct and len(direct) == len(keys):
        return DirectChannel.create(name, direct, maxsize)
    relayed = RayChannel.create(name, maxsize)
    if not direct:
        return relayed
    return RoutedChannel(name, DirectChannel.create(name, direct, maxsize), relayed, direct)


class RoutedChannel:
    """One keyed channel over two transports: the keys in ``direct_keys`` through ``direct`` (a
    ``DirectChannel``: both ends on one node), every other key through ``relayed`` (a
    ``RayChannel``). Same API as the others; per key nothing changes."""

    def __init__(self, name: str, direct, relayed, direct_keys: Sequence[Hashable]):
        self.name, self.maxsize = name, relayed.maxsize
        self.direct, self.relayed, self.direct_keys = direct, relayed, frozenset(direct_keys)

    def _route(self, key):
        return self.direct if key in self.direct_keys else self.relayed

    def put_async(self, item, key: Hashable = "default") -> ChannelFuture:
        return self._route(key).put_async(item, key)

    def get_async(self, key: Hashable = "default") -> ChannelFuture:
        return self._route(key).get_async(key)

    def put(self, item, key: Hashable = "default", timeout: Optional[float] = None) -> None:
        self._route(key).put(item, key, timeout)

    def get(self, key: Hashable = "default", timeout: Optional[float] = None):
        return self._route(key).get(key, timeout)

    def qsize(self, key: Optional[Hashable] = None) -> int:
        if key is not None:
            return self._route(key).qsize(key)
        return self.direct.qsize() + self.relayed.qsize()

    def close(self) -> None:
        self.direct.close()
        self.relayed.close()

    def destroy(self) -> None:
        try:
            self.direct.destroy()
        finally:
            self.relayed.destroy()

    def share(self, payload: Any) -> Shared:
        return self.relayed.share(payload)

    def listen(self, keys: Sequence[Hashable], take_over: bool = False) -> None:
        self.direct.listen([key for key in keys if key in self.direct_keys], take_over)
        self.relayed.listen([key for key in keys if key not in self.direct_keys], take_over)

    def reopen(self, key: Hashable) -> None:
        self._route(key).reopen(key)

    def pop_traffic(self) -> Dict[str, float]:
        direct, relayed = self.direct.pop_traffic(), self.relayed.pop_traffic()
        return {k: direct[k] + relayed[k] for k in direct}


class LateDelivery:
    """A drill's slow link (``cluster.inject_channel_latency_s``): each item taken from ``channel``
    reaches its consumer ``latency_s`` seconds after it arrived; everything else is the channel's
    own. An item in transit keeps its key's get busy, so the producer's bound (the channel's
    depth) still holds it back: backpressure, not a queue that grows."""

    def __init__(self, channel, latency_s: float):
        self.channel, self.latency_s = channel, latency_s

    def __getattr__(self, name: str):
        if name == "channel":  # while unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.channel, name)

    def get(self, key: Hashable = "default", timeout: Optional[float] = None):
        item = self.channel.get(key, timeout)
        time.sleep(self.latency_s)
        return item

    def get_async(self, key: Hashable = "default") -> ChannelFuture:
        return _LateFuture(self.channel.get_async(key), self.latency_s)


class _LateFuture(ChannelFuture):
    def __init__(self, inner: ChannelFuture, latency_s: float):
        self.inner, self.latency_s = inner, latency_s
        self.arrived: Optional[float] = None  # time.monotonic() when the inner get was first seen done

    def done(self) -> bool:
        if self.arrived is None and self.inner.done():
            self.arrived = time.monotonic()
        return self.arrived is not None and time.monotonic() >= self.arrived + self.latency_s

    def result(self, timeout: Optional[float] = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        item = self.inner.result(timeout)  # TimeoutError: still pending, as the inner get is
        if self.arrived is None:
            self.arrived = time.monotonic()
        due = self.arrived + self.latency_s
        if deadline is not None and due > deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            raise TimeoutError("the item is still in transit (cluster.inject_channel_latency_s)")
        time.sleep(max(0.0, due - time.monotonic()))
        return item
