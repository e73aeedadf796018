"""Handles to pending channel operations, and a wait for the first of several to complete
(a rollout worker serving several env processes answers whichever observations arrive first)."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Optional, Sequence

__all__ = ["ChannelFuture", "LocalFuture", "first_done"]


class ChannelFuture:
    """Handle to a pending ``put_async``/``get_async``.

    ``result(timeout)`` waits for the operation and returns the item (None for a put); on
    timeout it raises ``TimeoutError`` and the operation stays pending (it is not withdrawn).
    """

    def result(self, timeout: Optional[float] = None):
        raise NotImplementedError

    def done(self) -> bool:
        """True once the operation has completed (successfully or with ChannelClosed)."""
        raise NotImplementedError

    @classmethod
    def _block_on_any(cls, futures: Sequence["ChannelFuture"], timeout: float) -> None:
        """Wait up to ``timeout`` s for one of ``futures`` (all of this class) to make progress;
        may return early. The fallback sleeps a slice: a kind that can block on all of its
        futures at once overrides it."""
        time.sleep(min(timeout, ANY_POLL_SLICE_S))


# how often a wait on futures of mixed kinds looks again (a kind of its own blocks instead)
ANY_POLL_SLICE_S = 0.001


def first_done(futures: Sequence[ChannelFuture], timeout: float) -> Optional[int]:
    """The index of a done future among ``futures`` (the first in order), waiting up to
    ``timeout`` s for one; None when none is done by then. Nothing is taken from the others:
    a pending get stays armed and delivers its item later."""
    deadline = time.monotonic() + timeout
    kinds = {type(f) for f in futures}
    block = kinds.pop()._block_on_any if len(kinds) == 1 else ChannelFuture._block_on_any
    while True:
        for index, future in enumerate(futures):
            if future.done():
                return index
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        block(futures, remaining)


class LocalFuture(ChannelFuture):
    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def result(self, timeout: Optional[float] = None):
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:  # an alias of TimeoutError only from 3.11 on
            raise TimeoutError(f"channel operation not done after {timeout} s") from None

    def done(self) -> bool:
        return self._future.done()

    @classmethod
    def _block_on_any(cls, futures, timeout: float) -> None:
        concurrent.futures.wait([f._future for f in futures], timeout, return_when=concurrent.futures.FIRST_COMPLETED)
