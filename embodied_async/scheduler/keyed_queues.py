"""The queue logic every channel kind shares (``channel.LocalChannel`` under a lock with
thread-safe futures, ``channel.RayChannel`` inside one asyncio actor): per-key FIFO queues with
waiting lists, served first come, first served."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional


class ChannelClosed(Exception):
    """The channel was closed; raised by every operation waiting at or issued after close()."""


class KeyState:
    __slots__ = ("items", "getters", "putters")

    def __init__(self):
        self.items: deque = deque()
        self.getters: deque = deque()  # waiters for an item, first come first served
        self.putters: deque = deque()  # (item, waiter) pairs waiting for a free slot


class KeyedQueues:
    """Per-key FIFO queues with waiting lists; not thread-safe (callers serialise access).

    ``new_waiter()`` makes a future-like object with ``done``/``set_result``/``set_exception``.
    Invariants per key: items waiting => no getters waiting; putters waiting => items full.
    """

    def __init__(self, maxsize: int, new_waiter: Callable[[], Any]):
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0 = unbounded), got {maxsize}")
        self.maxsize = maxsize
        self.closed = False
        self._new_waiter = new_waiter
        self._keys: dict = {}

    def _done(self, value=None, exc: Optional[BaseException] = None):
        waiter = self._new_waiter()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(value)
        return waiter

    def _full(self, state: KeyState) -> bool:
        return self.maxsize > 0 and len(state.items) >= self.maxsize

    def _forget_if_idle(self, key) -> None:
        # Drop empty per-key state so that many short-lived keys (e.g. one per episode) don't leak.
        state = self._keys.get(key)
        if state is not None and not (state.items or state.getters or state.putters):
            del self._keys[key]

    def put(self, item, key):
        """Add ``item``; returns a waiter resolved (to None) once the item is queued."""
        if self.closed:
            return self._done(exc=ChannelClosed("put on a closed channel"))
        state = self._keys.setdefault(key, KeyState())
        if state.getters:  # someone is already waiting: hand the item over directly
            state.getters.popleft().set_result(item)
            self._forget_if_idle(key)
            return self._done()
        if not self._full(state):
            state.items.append(item)
            return self._done()
        waiter = self._new_waiter()
        state.putters.append((item, waiter))
        return waiter

    def get(self, key):
        """Take the oldest item of ``key``; returns a waiter resolved to the item."""
        if self.closed:
            return self._done(exc=ChannelClosed("get on a closed channel"))
        state = self._keys.setdefault(key, KeyState())
        if state.items:
            item = state.items.popleft()
            if state.putters:  # a slot just freed up: admit the oldest waiting put
                queued, putter = state.putters.popleft()
                state.items.append(queued)
                putter.set_result(None)
            self._forget_if_idle(key)
            return self._done(item)
        waiter = self._new_waiter()
        state.getters.append(waiter)
        return waiter

    def withdraw(self, key, waiter) -> bool:
        """Cancel a still-waiting operation; False if it already completed (use its result)."""
        state = self._keys.get(key)
        if waiter.done() or state is None:
            return False
        if waiter in state.getters:
            state.getters.remove(waiter)
        else:
            state.putters = deque(p for p in state.putters if p[1] is not waiter)
        self._forget_if_idle(key)
        return True

    def drop_getters(self, key) -> int:
        """Fail the gets waiting on ``key`` (their consumer is gone: a waiting get of a killed
        process would otherwise take the next item to nobody); how many."""
        state = self._keys.get(key)
        if state is None:
            return 0
        getters, state.getters = state.getters, deque()
        for waiter in getters:
            waiter.set_exception(ChannelClosed("its consumer was replaced"))
        self._forget_if_idle(key)
        return len(getters)

    def qsize(self, key=None) -> int:
        if key is not None:
            state = self._keys.get(key)
            return len(state.items) if state else 0
        return sum(len(state.items) for state in self._keys.values())

    def close(self) -> None:
        self.closed = True
        for state in self._keys.values():
            for waiter in list(state.getters) + [p[1] for p in state.putters]:
                waiter.set_exception(ChannelClosed("channel closed while waiting"))
        self._keys.clear()  # items can no longer be taken: free them now
