"""A keyed channel whose every key joins one producer process to one consumer process on the same
node directly, over a Unix socket: no process in between, one send per item.

The env <-> rollout links of the graph carry one small message per decision and sub-env batch.
Through a channel actor each item costs four remote calls and passes three processes; on a
2-core machine that traffic took about as much CPU as the simulation (benchmarks/). Here an item
is pickled once (protocol 5: numpy arrays travel as raw buffers, never pickled), written into the
socket and read on the other side.

Same API and semantics as the other channels (``channel.py``): FIFO per key, ``maxsize`` items
in flight per key (backpressure: the consumer acknowledges each item it takes), timeouts that
withdraw the operation, ``ChannelClosed``. The difference: each key has one producer process and
one consumer process: the consumer declares its keys (``listen``, or its first ``get``), the
producer's first ``put`` connects to it (waiting until it listens). The consumer's end going away
(closed, process ended) reaches the producer as ``ChannelClosed``, and the other way round.
``qsize`` works from any process of the node: the counts live in a small shared file.

Only the run's own processes can deliver items, and only message types are unpickled (how:
``channel_access.py``); a refused connection is counted and reported once per key.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import Any, Dict, Hashable, Optional, Sequence

import numpy as np

from embodied_async.scheduler.channel import ChannelClosed, ChannelFuture, Shared
from embodied_async.scheduler.channel_access import (
    accept_producer,
    close_socket,
    connect_to_consumer,
    dump_frame,
    load_frame,
    new_channel,
    open_listener,
    recv_exact,
    send_all,
    socket_path,
    stop_listening,
)
from embodied_async.scheduler.direct_link import GetWaiter, Link, wait_readable

__all__ = ["DirectChannel"]

_HEADER = struct.Struct("<II")  # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("<Q")
_POLL_SLICE_S = 0.5  # a wait without timeout still looks at the closed flag this often
_FRAME_REST_TIMEOUT_S = 60.0  # once a frame has begun, the rest is already on its way
_SENT, _TAKEN = 0, 1


def _counter_path(folder: str) -> str:
    return os.path.join(folder, "counts")


class DirectChannel:
    """Keyed point-to-point channel over Unix sockets; picklable, so it can be passed to workers.

    ``keys``: every key the channel will carry (each becomes one socket pair). Made by
    ``create``, which draws the channel's folder and secret; a copy carries both (keep copies
    inside the run: whoever holds one may deliver items).
    """

    def __init__(self, name: str, keys: Sequence[Hashable], maxsize: int, folder: str, secret: bytes):
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0 = unbounded), got {maxsize}")
        self.name, self.maxsize, self._folder, self._secret = name, maxsize, folder, secret
        self._id = os.path.basename(folder)
        self._keys = list(keys)
        self._init_process_state()

    def _init_process_state(self):
        self._index = {key: i for i, key in enumerate(self._keys)}
        self._links: Dict[Hashable, Link] = {}
        self._links_lock = threading.Lock()
        self._counts = None
        self._closed = False
        self._traffic_lock = threading.Lock()
        self.messages_sent = 0
        self.bytes_sent = 0
        self.refused_connections = 0

    @classmethod
    def create(cls, name: str, keys: Sequence[Hashable], maxsize: int = 0) -> "DirectChannel":
        """A new channel: its folder (mode 0700, a random name, on this node) and its secret."""
        folder, secret = new_channel(name)
        counts = np.memmap(_counter_path(folder), dtype=np.int64, mode="w+", shape=(max(1, len(keys)), 2))
        counts.flush()
        return cls(name, keys, maxsize, folder, secret)

    def __getstate__(self):
        return (self.name, self._keys, self.maxsize, self._folder, self._secret)

    def __setstate__(self, state):
        self.__init__(*state)

    # ---- per-key state ------------------------------------------------------------------------
    def _link(self, key) -> Link:
        if self._closed:
            raise ChannelClosed(f"channel {self.name!r} is closed")
        link = self._links.get(key)
        if link is None:
            if key not in self._index:
                raise KeyError(f"channel {self.name!r} carries the keys {self._keys}, not {key!r}")
            with self._links_lock:
                link = self._links.setdefault(key, Link())
        return link

    def _count(self, key, column: int, delta: int) -> None:
        if self._counts is None:
            try:
                self._counts = np.memmap(_counter_path(self._folder), dtype=np.int64, mode="r+",
                                         shape=(max(1, len(self._keys)), 2))
            except FileNotFoundError:  # destroyed by its creator while this process shuts down
                self._counts = np.zeros((max(1, len(self._keys)), 2), dtype=np.int64)
        self._counts[self._index[key], column] += delta

    def _closed_error(self, key, why: str) -> ChannelClosed:
        return ChannelClosed(f"channel {self.name!r} key {key!r}: {why}")

    # ---- producer side -------------------------------------------------------------------------
    def _connect(self, link: Link, key, deadline: Optional[float]) -> bool:
        """Connect to the consumer and prove that this process belongs to the run; False if the
        consumer is not listening yet by ``deadline``."""
        while link.out_sock is None:
            if self._closed:
                raise self._closed_error(key, "closed")
            try:
                sock = connect_to_consumer(self._folder, self._index[key], self._secret, self._id,
                                           f"channel {self.name!r} key {key!r}")
            except OSError as err:  # connected, and gone before the proof was written
                raise self._closed_error(key, f"the consumer's end is gone ({err})") from None
            if sock is None:  # not listening yet
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
                continue
            link.out_sock = sock
        return True

    def _read_acknowledgements(self, link: Link, key, timeout: Optional[float]) -> None:
        if timeout != 0 and not wait_readable(link.out_sock, timeout):
            return
        try:
            data = link.out_sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as err:
            raise self._closed_error(key, f"the consumer's end failed ({err})") from None
        if not data:
            raise self._closed_error(key, "the consumer closed its end")
        link.unacknowledged -= len(data)

    def _flush(self, link: Link, key, until: int, deadline: Optional[float]) -> bool:
        """Write queued items up to sequence number ``until``; False at ``deadline``."""
        if link.send_error is not None:
            raise link.send_error
        while link.outbox and link.outbox[0][0] <= until:
            if self._closed:
                raise self._closed_error(key, "closed")
            if not self._connect(link, key, deadline):
                return False
            self._read_acknowledgements(link, key, 0)
            while self.maxsize and link.unacknowledged >= self.maxsize:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._read_acknowledgements(link, key, _POLL_SLICE_S if remaining is None
                                            else min(remaining, _POLL_SLICE_S))
                if self._closed:
                    raise self._closed_error(key, "closed")
            seq, parts = link.outbox.popleft()
            self._count(key, _SENT, 1)  # before the send: the consumer may count it taken first
            try:
                send_all(link.out_sock, parts)
            except OSError as err:
                self._count(key, _SENT, -1)
                link.send_error = self._closed_error(key, f"the consumer's end is gone ({err})")
                link.outbox.clear()
                raise link.send_error from None
            link.written = seq
            link.unacknowledged += 1
            self._add_traffic(1, sum(len(p) for p in parts))
        return True

    def _enqueue(self, link: Link, item) -> int:
        body, buffers = dump_frame(item)
        raws = [b.raw() for b in buffers]
        header = _HEADER.pack(len(body), len(raws)) + b"".join(_LENGTH.pack(r.nbytes) for r in raws)
        link.queued += 1
        link.outbox.append((link.queued, [memoryview(header), memoryview(body), *raws]))
        return link.queued

    def put_async(self, item, key: Hashable = "default") -> ChannelFuture:
        """Queue ``item`` without blocking; the future resolves once it is written to the socket
        (at most ``maxsize`` items of a key are unacknowledged)."""
        link = self._link(key)
        with link.out_lock:
            seq = self._enqueue(link, item)
            # Connecting waits for the consumer to listen (once per key, at start-up): an item left
            # in the outbox of a process that goes on to wait elsewhere would never be written.
            self._connect(link, key, None)
            self._flush(link, key, seq, time.monotonic())
        return _PutFuture(self, link, key, seq)

    def put(self, item, key: Hashable = "default", timeout: Optional[float] = None) -> None:
        """Add ``item``, blocking while ``maxsize`` items of ``key`` are unacknowledged (or the
        consumer is not listening yet); TimeoutError after ``timeout`` s, the item not added."""
        link = self._link(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with link.out_lock:
            seq = self._enqueue(link, item)
            if not self._flush(link, key, seq, deadline):
                link.outbox = deque(entry for entry in link.outbox if entry[0] != seq)
                raise TimeoutError(f"channel {self.name!r} key {key!r}: put timed out after {timeout} s")

    # ---- consumer side -------------------------------------------------------------------------
    def _listen(self, link: Link, key) -> None:
        if link.listener is None and link.in_sock is None:
            link.listener = open_listener(self._folder, self._index[key], f"channel {self.name!r} key {key!r}")

    def _count_refusal(self, link: Link, key, why: str) -> None:
        link.refused += 1
        with self._traffic_lock:
            self.refused_connections += 1
        if link.refused == 1:  # once per key: a peer that keeps trying must not flood the log
            print(f"[channel] warning: refused a connection to channel {self.name!r} key {key!r} from {why}; it was "
                  "closed unread (only this run's processes may connect; traffic/*_refused_connections counts them)",
                  file=sys.stderr, flush=True)

    def _accept(self, link: Link, key, deadline: Optional[float]) -> bool:
        while link.in_sock is None:
            if self._closed:
                raise self._closed_error(key, "closed")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = _POLL_SLICE_S if remaining is None else min(remaining, _POLL_SLICE_S)
            if wait_readable(link.listener, wait):
                try:
                    sock, why = accept_producer(link.listener, self._secret, self._id, self._index[key])
                except OSError as err:
                    raise self._closed_error(key, f"closed ({err})") from None
                if why is not None:
                    self._count_refusal(link, key, why)
                    if deadline is not None and time.monotonic() >= deadline:
                        return False  # a stream of refused peers must not outlast the get's timeout
                    continue
                link.in_sock = sock
                stop_listening(link.listener, self._folder, self._index[key])
                link.listener = None
            elif deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def _receive_one(self, link: Link, key):
        """The next frame, read whole (its pickle and its buffers), and acknowledged."""
        sock = link.in_sock
        try:
            sock.settimeout(_FRAME_REST_TIMEOUT_S)
            body_length, count = _HEADER.unpack(recv_exact(sock, _HEADER.size, key))
            lengths = [_LENGTH.unpack(recv_exact(sock, _LENGTH.size, key))[0] for _ in range(count)]
            body = recv_exact(sock, body_length, key)
            buffers = [recv_exact(sock, n, key) for n in lengths]
            sock.settimeout(None)
        except (OSError, EOFError) as err:
            sock.close()  # possibly mid-frame: the stream cannot be read on from here
            raise self._closed_error(key, f"the producer's end is gone ({err})") from None
        self._count(key, _TAKEN, 1)
        if self.maxsize:
            try:
                sock.sendall(b"\1")
                self._add_traffic(1, 1)
            except OSError:  # the producer closed after its last item: the item is still ours
                pass
        return body, buffers

    def _serve(self, link: Link, key, waiter: GetWaiter, deadline: Optional[float]) -> bool:
        """Read items for the waiting gets, oldest first, until ``waiter`` has one."""
        while not waiter.done:
            if self._closed:
                raise self._closed_error(key, "closed")
            if not self._accept(link, key, deadline):
                return False
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = _POLL_SLICE_S if remaining is None else min(remaining, _POLL_SLICE_S)
            if not wait_readable(link.in_sock, wait):
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                continue
            body, buffers = self._receive_one(link, key)
            oldest = link.waiters.popleft()
            try:
                oldest.item = load_frame(body, buffers)
            except Exception as err:  # this item is lost, the link is not: the frame was read whole
                oldest.error = err
            oldest.done = True
        return True

    def listen(self, keys: Sequence[Hashable], take_over: bool = False) -> None:
        """Declare this process the consumer of ``keys`` and accept their producers from now on.
        A producer's first put waits until its consumer listens, so every consumer calls this
        when it starts, before it waits for anything: otherwise two processes that each put
        before they get could wait for each other's listener. Taking over, the socket names the
        killed consumer may have left are removed first (a stopped one still holds its socket)."""
        for key in keys:
            link = self._link(key)
            with link.in_lock:
                if take_over:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(socket_path(self._folder, self._index[key]))
                self._listen(link, key)

    def get_async(self, key: Hashable = "default") -> ChannelFuture:
        """Ask for the next item of ``key`` without blocking; the future resolves to it."""
        link = self._link(key)
        with link.in_lock:
            self._listen(link, key)
            waiter = GetWaiter()
            link.waiters.append(waiter)
        return _GetFuture(self, link, key, waiter)

    def get(self, key: Hashable = "default", timeout: Optional[float] = None):
        """Take the oldest item of ``key``, blocking until there is one; TimeoutError after
        ``timeout`` s (no item is taken then)."""
        link = self._link(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with link.in_lock:
            self._listen(link, key)
            waiter = GetWaiter()
            link.waiters.append(waiter)
            try:
                served = self._serve(link, key, waiter, deadline)
            finally:  # a get that ends unserved (timed out, or its producer gone) leaves no waiter behind
                if not waiter.done:
                    link.waiters.remove(waiter)
            if not served:
                raise TimeoutError(f"channel {self.name!r} key {key!r}: get timed out after {timeout} s")
            return waiter.result()

    # ---- the rest of the channel API -----------------------------------------------------------
    def reopen(self, key: Hashable) -> None:
        """The process at ``key``'s other end was replaced (it died or hung): forget the old
        connection and what was queued for it. As the producer, the next put connects to the new
        consumer; as the consumer, listen again: the gets already armed are served by the new producer."""
        link = self._link(key)
        with link.out_lock, link.in_lock:
            consumer = link.in_sock is not None or link.listener is not None
            for sock in (link.out_sock, link.in_sock):
                if sock is not None:
                    close_socket(sock)
            link.out_sock, link.in_sock, link.send_error = None, None, None
            link.outbox.clear()
            link.written, link.unacknowledged = link.queued, 0
            if consumer:
                self._listen(link, key)
        self._count(key, _SENT, 0)  # maps the counts: nothing is queued now
        self._counts[self._index[key], _SENT] = self._counts[self._index[key], _TAKEN]

    def qsize(self, key: Optional[Hashable] = None) -> int:
        """Items written and not yet taken, for ``key`` or all keys, from any process of the node
        the channel was created on (the counts are a file there; direct keys of another node,
        under a ``RoutedChannel``, count nothing here)."""
        try:
            counts = np.fromfile(_counter_path(self._folder), dtype=np.int64).reshape(-1, 2)
        except FileNotFoundError:  # destroyed
            return 0
        if key is not None:
            if key not in self._index:
                return 0
            counts = counts[self._index[key]:self._index[key] + 1]
        return int(np.clip(counts[:, _SENT] - counts[:, _TAKEN], 0, None).sum())

    def close(self) -> None:
        """Close this process's ends: its later operations fail with ChannelClosed, and so do the
        peers' operations on the keys it served."""
        self._closed = True
        with self._links_lock:
            links = list(self._links.items())
        for key, link in links:
            if link.listener is not None:  # still listening: the socket's name is ours to remove
                stop_listening(link.listener, self._folder, self._index[key])
            for sock in (link.out_sock, link.in_sock):
                if sock is not None:
                    close_socket(sock)
        with contextlib.suppress(OSError):  # the last process to close on a node removes its (empty) folder
            os.rmdir(self._folder)

    def destroy(self) -> None:
        """Close, and remove the channel's folder on this node (call once, from the process that
        created it, when the run ends)."""
        self.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def share(self, payload: Any) -> Shared:
        """``payload`` by value: every receiver gets its own copy (a Ray object handle cannot
        travel through a socket, so weights for many ranks go through a ``RayChannel``)."""
        return Shared(value=payload)

    def _add_traffic(self, messages: int, size: int) -> None:
        with self._traffic_lock:
            self.messages_sent += messages
            self.bytes_sent += size

    def pop_traffic(self) -> Dict[str, float]:
        """Messages and bytes this process sent since the last call (acknowledgements included),
        and the connections it refused (peers that failed the checks; see the module's notes)."""
        with self._traffic_lock:
            sent = {"messages": float(self.messages_sent), "bytes": float(self.bytes_sent),
                    "refused_connections": float(self.refused_connections)}
            self.messages_sent = self.bytes_sent = self.refused_connections = 0
        return sent


class _PutFuture(ChannelFuture):
    def __init__(self, channel: DirectChannel, link: Link, key, seq: int):
        self._channel, self._link, self._key, self._seq = channel, link, key, seq

    def _advance(self, deadline: Optional[float]) -> bool:
        link = self._link
        if link.written >= self._seq:
            return True
        if link.send_error is not None:  # the connection broke before this item was written
            raise link.send_error
        with link.out_lock:
            return self._channel._flush(link, self._key, self._seq, deadline)

    def result(self, timeout: Optional[float] = None):
        if not self._advance(None if timeout is None else time.monotonic() + timeout):
            raise TimeoutError(f"channel operation not done after {timeout} s")
        return None

    def done(self) -> bool:
        try:
            return self._advance(time.monotonic())
        except ChannelClosed:
            return True


class _GetFuture(ChannelFuture):
    def __init__(self, channel: DirectChannel, link: Link, key, waiter: GetWaiter):
        self._channel, self._link, self._key, self._waiter = channel, link, key, waiter

    def _advance(self, deadline: Optional[float]) -> bool:
        if self._waiter.done:
            return True
        with self._link.in_lock:
            return self._channel._serve(self._link, self._key, self._waiter, deadline)

    def result(self, timeout: Optional[float] = None):
        if not self._advance(None if timeout is None else time.monotonic() + timeout):
            raise TimeoutError(f"channel operation not done after {timeout} s")
        return self._waiter.result()

    def done(self) -> bool:
        try:
            return self._advance(time.monotonic())
        except ChannelClosed:
            return True

    @classmethod
    def _block_on_any(cls, futures, timeout: float) -> None:
        poller = select.poll()  # the sockets the gets read from (the listener until a producer connects)
        for future in futures:
            try:
                poller.register(future._link.in_sock or future._link.listener, select.POLLIN)
            except (AttributeError, OSError, TypeError, ValueError):  # closed meanwhile: done() says so
                return
        poller.poll(max(0, int(timeout * 1000)))
