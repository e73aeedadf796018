"""Keyed FIFO channels with backpressure, in-process (:class:`LocalChannel`) or across Ray
processes (:class:`RayChannel`).

Each key has its own FIFO queue of capacity ``maxsize`` (0 = unbounded). ``put`` blocks while
its key is full, ``get`` while its key is empty; both take a timeout and raise ``TimeoutError``.
A timed-out operation is withdrawn: it never consumes or adds an item later. ``close()`` fails
every waiting and later operation with :class:`ChannelClosed`.

Both implementations run the same queue logic (:class:`KeyedQueues`, ``keyed_queues.py``): LocalChannel under a
lock with thread-safe futures, RayChannel inside one asyncio actor with asyncio futures. Sharing
it keeps the two behaviourally identical, and waiters are served first come, first served.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import uuid
from typing import Any, Callable, Dict, Hashable, Optional, Sequence

from embodied_async.scheduler.futures import ChannelFuture, LocalFuture
from embodied_async.scheduler.keyed_queues import ChannelClosed, KeyedQueues

__all__ = ["ChannelClosed", "ChannelFuture", "LocalChannel", "RayChannel", "Shared", "create_channel", "payload_bytes"]

_OK, _TIMEOUT, _CLOSED = "ok", "timeout", "closed"


def payload_bytes(item: Any) -> int:
    """Bytes of the arrays, tensors and strings in a message (what a transport has to move);
    a ``Shared`` handle counts nothing (its payload moves once, through the object store)."""
    if hasattr(item, "nbytes") and not isinstance(item, (bytes, bytearray)):
        return int(item.nbytes)
    if hasattr(item, "element_size") and hasattr(item, "numel"):  # torch.Tensor
        return int(item.element_size() * item.numel())
    if isinstance(item, (str, bytes, bytearray)):
        return len(item)
    if isinstance(item, dict):
        return sum(payload_bytes(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(payload_bytes(v) for v in item)
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return sum(payload_bytes(getattr(item, f.name)) for f in dataclasses.fields(item))
    return 8


class Shared:
    """A payload stored once and read by every receiver of the messages that carry it.

    Weights go to each rollout rank: put into a message as is, they would be serialised once per
    rank on the way into the channel and again on the way out. ``channel.share(payload)`` stores
    them once (Ray's object store; in process: the object itself) and the message carries only
    this handle; ``get()`` reads the payload from the store. Under Ray the payload belongs to the
    process that shared it: it can be read while that process lives (a receiver of weights only
    needs them while the actor that published them runs).
    """

    def __init__(self, value: Any = None, ref: Any = None):
        self._value, self._ref = value, ref

    def get(self) -> Any:
        return _ray().get(self._ref) if self._ref is not None else self._value


class LocalChannel:
    """In-process keyed channel, safe to share between threads."""

    def __init__(self, maxsize: int = 0, name: str = "local"):
        self.name = name
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._queues = KeyedQueues(maxsize, concurrent.futures.Future)

    def put_async(self, item, key: Hashable = "default") -> ChannelFuture:
        """Queue ``item`` without blocking; the future resolves once it is in the queue."""
        with self._lock:
            return LocalFuture(self._queues.put(item, key))

    def get_async(self, key: Hashable = "default") -> ChannelFuture:
        """Ask for the next item of ``key`` without blocking; the future resolves to it."""
        with self._lock:
            return LocalFuture(self._queues.get(key))

    def _wait(self, key, waiter: concurrent.futures.Future, timeout, what: str):
        try:
            return waiter.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                if self._queues.withdraw(key, waiter):
                    raise TimeoutError(
                        f"channel {self.name!r} key {key!r}: {what} timed out after {timeout} s"
                    ) from None
            return waiter.result()  # it completed just as the timeout expired

    def put(self, item, key: Hashable = "default", timeout: Optional[float] = None) -> None:
        """Add ``item``, blocking while ``key`` is full; TimeoutError if still full after
        ``timeout`` seconds (the item is then not added)."""
        with self._lock:
            waiter = self._queues.put(item, key)
        self._wait(key, waiter, timeout, "put")

    def get(self, key: Hashable = "default", timeout: Optional[float] = None):
        """Take the oldest item of ``key``, blocking until there is one; TimeoutError after
        ``timeout`` seconds (and no item is taken)."""
        with self._lock:
            waiter = self._queues.get(key)
        return self._wait(key, waiter, timeout, "get")

    def qsize(self, key: Optional[Hashable] = None) -> int:
        """Items queued under ``key``, or under all keys when ``key`` is None."""
        with self._lock:
            return self._queues.qsize(key)

    def close(self) -> None:
        """Fail all waiting and later operations with ChannelClosed; queued items are dropped."""
        with self._lock:
            self._queues.close()

    def share(self, payload: Any) -> Shared:
        """A handle to ``payload`` for messages to several receivers (in process: no copy)."""
        return Shared(value=payload)

    def pop_traffic(self) -> Dict[str, float]:
        """Messages and bytes sent between processes, connections refused: none in process."""
        return {"messages": 0.0, "bytes": 0.0, "refused_connections": 0.0}

    def listen(self, keys: Sequence[Hashable], take_over: bool = False) -> None:
        """Declare this process a consumer of ``keys`` (needed by ``DirectChannel``; here nothing).
        ``take_over``: this process replaces the keys' consumer, which the runner killed (dead, or
        stopped and dying); nothing that one left on the channel may take the keys' next items."""

    def reopen(self, key: Hashable) -> None:
        """The process at ``key``'s other end was replaced (``DirectChannel`` then connects anew;
        here the queue is the same for both, and what the old one left in it the messages'
        ``generation`` tells apart)."""


class _ChannelActor:
    """The Ray actor behind a RayChannel: the shared queue logic on an asyncio event loop.

    Ray may start an async actor's calls out of submission order (e.g. while a large argument
    is still being fetched), so each call carries (caller, seq) and waits for the caller's
    earlier calls to reach the queues first: this keeps one caller's puts FIFO per key.
    """

    def __init__(self, maxsize: int):
        self._queues = KeyedQueues(maxsize, lambda: asyncio.get_running_loop().create_future())
        # caller -> seq of its next call allowed to run. One small entry per RayChannel copy
        # that ever made a call; never dropped, since a copy may call again at any time.
        self._next_seq: dict = {}
        self._turns: dict = {}  # (caller, seq) -> future set when that call may run

    async def _enter(self, caller: str, seq: int) -> None:
        # Waiting for the turn is not counted against the timeout: the earlier calls are already
        # in flight, and skipping a turn would stall every later call of this caller.
        if self._next_seq.get(caller, 0) != seq:
            turn = asyncio.get_running_loop().create_future()
            self._turns[(caller, seq)] = turn
            await turn

    def _leave(self, caller: str, seq: int) -> None:
        self._next_seq[caller] = seq + 1
        turn = self._turns.pop((caller, seq + 1), None)
        if turn is not None:
            turn.set_result(None)

    async def _run(self, caller, seq, op: Callable, key, timeout):
        await self._enter(caller, seq)
        try:
            waiter = op()
        finally:
            self._leave(caller, seq)
        if not waiter.done():
            try:
                # shield: on timeout the waiter must stay intact so withdraw() can decide.
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except asyncio.TimeoutError:
                if self._queues.withdraw(key, waiter):
                    return _TIMEOUT, None
            except asyncio.CancelledError:  # ray.cancel: don't leave a dead waiter queued
                self._queues.withdraw(key, waiter)
                raise
            except ChannelClosed:  # close() failed the waiter; reported just below
                pass
        try:
            return _OK, waiter.result()
        except ChannelClosed:
            return _CLOSED, None

    async def put(self, caller, seq, item, key, timeout):
        return await self._run(caller, seq, lambda: self._queues.put(item, key), key, timeout)

    async def get(self, caller, seq, key, timeout):
        return await self._run(caller, seq, lambda: self._queues.get(key), key, timeout)

    async def qsize(self, caller, seq, key):
        await self._enter(caller, seq)
        self._leave(caller, seq)
        return self._queues.qsize(key)

    async def drop_getters(self, caller, seq, keys):
        await self._enter(caller, seq)
        self._leave(caller, seq)
        return sum(self._queues.drop_getters(key) for key in keys)

    async def close(self, caller, seq):
        await self._enter(caller, seq)
        self._leave(caller, seq)
        self._queues.close()

    async def maxsize(self):
        return self._queues.maxsize


def _ray():
    import ray  # imported on first use: LocalChannel users need not pay for importing Ray

    return ray


_remote_actor_class = None


def _actor_class():
    global _remote_actor_class
    if _remote_actor_class is None:
        # num_cpus=0: a channel must never hold back a worker waiting for a CPU; high
        # max_concurrency so that many blocked gets/puts cannot starve the calls that free them.
        _remote_actor_class = _ray().remote(num_cpus=0, max_concurrency=1000, enable_task_events=False)(_ChannelActor)
    return _remote_actor_class


def _unwrap(reply, name, key, what, timeout):
    status, value = reply
    if status == _OK:
        return value
    if status == _TIMEOUT:
        raise TimeoutError(f"channel {name!r} key {key!r}: {what} timed out after {timeout} s")
    raise ChannelClosed(f"channel {name!r} is closed")


class _RayFuture(ChannelFuture):
    def __init__(self, ref, name, key, what, on_item=None):
        self._ref, self._name, self._key, self._what = ref, name, key, what
        self._reply = None
        self._on_item = on_item

    def result(self, timeout: Optional[float] = None):
        if self._reply is None:
            try:
                self._reply = _ray().get(self._ref, timeout=timeout)
            except _ray().exceptions.GetTimeoutError:
                raise TimeoutError(f"channel operation not done after {timeout} s") from None
            if self._on_item is not None and self._reply[0] == _OK:
                self._on_item(self._reply[1])
        return _unwrap(self._reply, self._name, self._key, self._what, None)

    def done(self) -> bool:
        return self._reply is not None or bool(_ray().wait([self._ref], timeout=0)[0])

    @classmethod
    def _block_on_any(cls, futures, timeout: float) -> None:
        pending = [f._ref for f in futures if f._reply is None]
        if len(pending) == len(futures):
            _ray().wait(pending, num_returns=1, timeout=timeout)


class RayChannel:
    """Keyed channel held by one Ray actor; picklable, so it can be passed to other actors.

    Same API and behaviour as :class:`LocalChannel`. Every operation is one actor call.
    Numpy arrays read back may be read-only (Ray deserialises them without a copy).
    """

    def __init__(self, actor, name: str, maxsize: int = 0):
        self._actor = actor
        self.name = name
        self.maxsize = maxsize
        self._init_caller()

    def _init_caller(self):
        # Each process's copy is its own "caller", ordered independently of the others.
        self._lock = threading.Lock()
        self._caller = uuid.uuid4().hex
        self._seq = 0
        self._messages = 0
        self._bytes = 0

    @classmethod
    def create(cls, name: str, maxsize: int = 0) -> "RayChannel":
        """Start the channel's actor, named ``channel:<name>`` (the name must be unused)."""
        if maxsize < 0:  # checked here: inside the actor it would only surface on first use
            raise ValueError(f"maxsize must be >= 0 (0 = unbounded), got {maxsize}")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the creator's node (the driver's): the node whose loss ends the run anyway, so a lost
        # worker node never takes a channel the rest of the run needs with it
        here = NodeAffinitySchedulingStrategy(_ray().get_runtime_context().get_node_id(), soft=False)
        actor = _actor_class().options(name=f"channel:{name}", scheduling_strategy=here).remote(maxsize)
        return cls(actor, name, maxsize)

    @classmethod
    def connect(cls, name: str) -> "RayChannel":
        """Attach to the channel created under ``name`` elsewhere in the cluster."""
        actor = _ray().get_actor(f"channel:{name}")
        return cls(actor, name, maxsize=_ray().get(actor.maxsize.remote()))

    def __getstate__(self):
        return {"actor": self._actor, "name": self.name, "maxsize": self.maxsize}

    def __setstate__(self, state):
        self._actor, self.name, self.maxsize = state["actor"], state["name"], state["maxsize"]
        self._init_caller()

    def _call(self, method: str, *args, payload: int = 0):
        # The lock makes seq order equal submission order across this process's threads; seq
        # only advances once .remote() succeeded (it fails e.g. on an unpicklable item).
        with self._lock:
            ref = getattr(self._actor, method).remote(self._caller, self._seq, *args)
            self._seq += 1
            self._messages += 2  # the call and its reply
            self._bytes += payload
        return ref

    def _count_received(self, item) -> None:
        with self._lock:
            self._bytes += payload_bytes(item)

    def listen(self, keys: Sequence[Hashable], take_over: bool = False) -> None:
        """Declare this process a consumer of ``keys``. Taking over, the gets the killed consumer
        left waiting are failed first (an armed get of a dead process takes the next item to nobody)."""
        if take_over:
            _ray().get(self._call("drop_getters", list(keys)))

    def reopen(self, key: Hashable) -> None:
        """The process at ``key``'s other end was replaced (``DirectChannel`` then connects anew;
        here the queue is the same for both, and what the old one left in it the messages'
        ``generation`` tells apart)."""

    def pop_traffic(self) -> Dict[str, float]:
        """Messages (each call and its reply) and payload bytes this process's copy moved since
        the last call: an item crosses twice, into the channel's actor and out of it. Ray's own
        token authentication guards who may call the actor: no connection is ours to refuse."""
        with self._lock:
            sent = {"messages": float(self._messages), "bytes": float(self._bytes), "refused_connections": 0.0}
            self._messages = self._bytes = 0
        return sent

    def put_async(self, item, key: Hashable = "default") -> ChannelFuture:
        """Queue ``item`` without blocking; the future resolves once it is in the queue."""
        return _RayFuture(self._call("put", item, key, None, payload=payload_bytes(item)), self.name, key, "put")

    def get_async(self, key: Hashable = "default") -> ChannelFuture:
        """Ask for the next item of ``key`` without blocking; the future resolves to it."""
        return _RayFuture(self._call("get", key, None), self.name, key, "get", self._count_received)

    def put(self, item, key: Hashable = "default", timeout: Optional[float] = None) -> None:
        """Add ``item``, blocking while ``key`` is full; TimeoutError after ``timeout`` s."""
        reply = _ray().get(self._call("put", item, key, timeout, payload=payload_bytes(item)))
        _unwrap(reply, self.name, key, "put", timeout)

    def get(self, key: Hashable = "default", timeout: Optional[float] = None):
        """Take the oldest item of ``key``, blocking until there is one; TimeoutError after
        ``timeout`` s (the timeout runs in the actor, so no item is taken afterwards)."""
        reply = _ray().get(self._call("get", key, timeout))
        item = _unwrap(reply, self.name, key, "get", timeout)
        self._count_received(item)
        return item

    def qsize(self, key: Optional[Hashable] = None) -> int:
        """Items queued under ``key``, or under all keys when ``key`` is None."""
        return _ray().get(self._call("qsize", key))

    def close(self) -> None:
        """Fail all waiting and later operations with ChannelClosed; queued items are dropped."""
        _ray().get(self._call("close"))

    def share(self, payload: Any) -> Shared:
        """``payload`` stored once in Ray's object store; messages carry only the handle."""
        return Shared(ref=_ray().put(payload))

    def destroy(self) -> None:
        """Close, then end the actor process (the channel's name becomes free again)."""
        try:
            self.close()
        finally:
            _ray().kill(self._actor)


def create_channel(backend: str, name: str, maxsize: int = 0):
    """Make a channel: ``backend="ray"`` -> :meth:`RayChannel.create`, ``"local"`` ->
    :class:`LocalChannel`."""
    if backend == "ray":
        return RayChannel.create(name, maxsize)
    if backend == "local":
        return LocalChannel(maxsize, name=name)
    raise ValueError(f"unknown channel backend {backend!r}; use 'ray' or 'local'")
