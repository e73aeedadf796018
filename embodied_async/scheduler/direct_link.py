"""A direct channel's state per key in one process (``direct_channel.DirectChannel``): its
connection's ends, the items queued for it, the gets waiting on it."""

from __future__ import annotations

import select
import socket
import threading
from collections import deque
from typing import Optional


def wait_readable(sock: socket.socket, timeout: Optional[float]) -> bool:
    """True once ``sock`` is readable, hung up, or closed under us (the next operation on it then
    reports that). poll(), not select(): select fails for descriptors from 1024 on."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
    except (OSError, ValueError):  # closed by another thread: fileno() is -1 or the fd is gone
        return True


class GetWaiter:
    """A get waiting for its item (or the error that ended it)."""

    __slots__ = ("item", "error", "done")

    def __init__(self):
        self.item, self.error, self.done = None, None, False

    def result(self):
        if self.error is not None:
            raise self.error
        return self.item


class Link:
    """One key's connection as seen from this process: its producer end (``out_sock``) and its
    consumer end (``listener``, then ``in_sock``); a process normally holds one of the two."""

    def __init__(self):
        # one lock per end: a process may hold both ends of a key (tests, one-process use), and a
        # put waiting for an acknowledgement must not keep the get that sends it out
        self.out_lock = threading.RLock()
        self.in_lock = threading.RLock()
        self.out_sock: Optional[socket.socket] = None
        self.listener: Optional[socket.socket] = None
        self.in_sock: Optional[socket.socket] = None
        self.outbox: deque = deque()  # (sequence number, frame parts) not yet written
        self.queued = 0  # sequence numbers given to puts
        self.written = 0  # the last sequence number written into the socket (the earlier ones
        # were written too, or withdrawn by a put that timed out)
        self.unacknowledged = 0  # written, not yet taken by the consumer
        self.send_error: Optional[Exception] = None  # the connection broke: unsent items are lost
        self.waiters: deque = deque()  # gets waiting for an item, oldest first
        self.refused = 0  # connections to this key's listener that failed the checks
