"""Who may deliver items on a direct channel, and what an item may be made of.

A direct channel (``direct_channel.py``) unpickles the frames it reads from a Unix socket, so only
the run's own processes may connect. Three locks: the first two each keep out a local user of
another uid, the third also any process of our own uid outside the run (another run of ours cannot
cross wires):

- the sockets and the counts live in a folder made for the channel with mode 0700 (other users
  cannot reach a socket in it, nor list, swap or plant files): not in Linux's abstract namespace,
  which has no permissions at all and whose names every user can read in ``/proc/net/unix``;
- on accept, the peer's uid (``SO_PEERCRED``) must be ours; on connect, the listener's too;
- before any frame, the producer proves it holds the channel's secret (32 random bytes drawn when
  the channel is created, which reach the workers only inside the channel object, through Ray):
  an HMAC-SHA256 of the channel, the key and a fresh nonce. A consumer accepts one producer per
  key and then stops listening, so a proof opens one connection only (and only a process that
  could read the producer's memory anyway could record it: root, or our own uid).

A connection that fails a check is closed before anything it sent is read beyond the fixed-size
proof. A peer of our uid that never proves itself holds the consumer for at most
``PROOF_TIMEOUT_S`` per try.

Frames are then loaded by an unpickler that admits only what the graph sends (defence in depth,
should a peer ever get past the checks): arrays of plain dtypes and numpy scalars (as raw bytes
with a dtype string, rebuilt here), plain containers and the message dataclasses of
``embodied_async.data``. Anything else, ``os.system``, numpy's own rebuilders or a torch tensor
alike, is refused by name before it is imported or called.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import hmac
import io
import os
import pickle
import secrets
import socket
import struct
import tempfile
import time
from typing import Any, List, Optional, Tuple

import numpy as np

from embodied_async import data as messages
from embodied_async.private_files import private_folder

__all__ = ["PROOF_TIMEOUT_S", "accept_producer", "close_socket", "connect_to_consumer", "dump_frame", "load_frame",
           "new_channel", "open_listener", "socket_path", "stop_listening"]

_PROOF = struct.Struct("<4s16s32s")  # magic, the producer's nonce, HMAC-SHA256 (``_proof_digest``)
_PROOF_MAGIC = b"EAC1"
# The producer writes its proof right after connecting, before anything else: a peer that has
# not sent it by then is not our producer.
PROOF_TIMEOUT_S = 5.0
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def new_channel(name: str) -> Tuple[str, bytes]:
    """A new channel's folder for its sockets and counts (mode 0700, a random name, in
    $EMBODIED_ASYNC_CHANNEL_DIR, else /dev/shm, else the temp folder; short: a socket's path may
    have at most 107 bytes) and its secret."""
    parent = os.environ.get("EMBODIED_ASYNC_CHANNEL_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm")
                                                              else tempfile.gettempdir())
    label = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:24]
    folder = tempfile.mkdtemp(prefix=f"embodied_async-{label}-", dir=parent)  # made anew with mode 0700
    return folder, secrets.token_bytes(32)


def socket_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"{index}.sock")


def open_listener(folder: str, index: int, what: str) -> socket.socket:
    """The consumer's listening socket for key ``index`` (``what`` names it in errors)."""
    private_folder(folder, create=True)  # made here when the consumer is on another node
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = socket_path(folder, index)
    try:
        listener.bind(address)  # fails if the path exists: never take over another's socket
    except OSError as err:
        listener.close()
        if err.errno == errno.EADDRINUSE:
            raise RuntimeError(f"{what}: another process already receives this key ({err}); a direct channel "
                               "has one consumer per key") from None
        raise RuntimeError(f"{what}: cannot listen on {address}: {err}") from None
    os.chmod(address, 0o600)  # the folder already keeps others out; this holds if it ever did not
    listener.listen(16)  # a backlog: connections refused one by one cannot crowd out the producer's
    return listener


def accept_producer(listener: socket.socket, secret: bytes, channel_id: str,
                    index: int) -> Tuple[Optional[socket.socket], Optional[str]]:
    """The next connection: (socket, None) if it proved to be this key's producer, else (None,
    why), closed unread."""
    sock, _ = listener.accept()
    why = _check_producer(sock, secret, channel_id, index)
    if why is None:
        return sock, None
    close_socket(sock)
    return None, why


def close_socket(sock: socket.socket) -> None:
    """Shut down, then close: a shutdown also wakes a thread waiting on the socket."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def stop_listening(listener: socket.socket, folder: str, index: int) -> None:
    """One producer per key: once it is in (or the channel closes), close the listener (waking a
    wait on it) and take the socket's name away."""
    close_socket(listener)
    try:
        os.unlink(socket_path(folder, index))
    except FileNotFoundError:
        pass


def connect_to_consumer(folder: str, index: int, secret: bytes, channel_id: str, what: str) -> Optional[socket.socket]:
    """Producer side: a socket connected to key ``index``'s consumer, the proof sent; None while
    the consumer does not listen yet. The folder is checked first (one someone else made could
    hold their socket), then the listener's uid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not private_folder(folder, create=False):
            sock.close()
            return None  # the consumer has not made it yet (on another node)
        sock.connect(socket_path(folder, index))
        uid = _peer_uid(sock)
        if uid is not None and uid != os.getuid():
            raise RuntimeError(f"{what}: the socket in {folder} is served by uid {uid}, not by this run's uid "
                               f"{os.getuid()}; refusing to send to it")
        nonce = secrets.token_bytes(16)  # the proof fits the socket's buffer: sent before the consumer reads
        sock.sendall(_PROOF.pack(_PROOF_MAGIC, nonce, _proof_digest(secret, channel_id, index, nonce)))
        return sock
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise


def _peer_uid(sock: socket.socket) -> Optional[int]:
    """The uid of the process at the other end of a Unix socket (None where the system does not
    say: only Linux has SO_PEERCRED; there the folder and the proof still hold)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    _, uid, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    return uid


def _proof_digest(secret: bytes, channel_id: str, index: int, nonce: bytes) -> bytes:
    message = b"embodied_async producer\0" + channel_id.encode() + b"\0" + struct.pack("<Q", index) + nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


def _check_producer(sock: socket.socket, secret: bytes, channel_id: str, index: int) -> Optional[str]:
    """Why the peer on ``sock`` is not this key's producer, or None once it proved it is. Nothing it
    sends is read before its uid passed, and only the fixed-size proof before the proof passed."""
    uid = _peer_uid(sock)
    if uid is not None and uid != os.getuid():
        return f"a process of uid {uid} (this run's uid is {os.getuid()})"
    proof, deadline = b"", time.monotonic() + PROOF_TIMEOUT_S
    try:
        while len(proof) < _PROOF.size:
            sock.settimeout(max(0.0, deadline - time.monotonic()))
            part = sock.recv(_PROOF.size - len(proof))
            if not part:
                return "a peer that closed before proving the run's secret"
            proof += part
    except socket.timeout:
        return f"a peer that sent no proof of the run's secret within {PROOF_TIMEOUT_S:g} s"
    except OSError:
        return "a peer that closed before proving the run's secret"
    magic, nonce, digest = _PROOF.unpack(proof)
    if magic != _PROOF_MAGIC or not hmac.compare_digest(digest, _proof_digest(secret, channel_id, index, nonce)):
        return "a peer without the run's secret"
    sock.settimeout(None)
    return None


# Arrays and numpy scalars travel as (raw bytes, dtype string, shape) and are rebuilt by the two
# functions below, never by numpy's own rebuilders: those take a dtype's internal state as given,
# so a forged frame could make an array whose object field points anywhere in memory.
_PLAIN_KINDS = frozenset("biufcmMSU")  # numbers, bools, dates and durations, bytes, text


def _plain_dtype(spec: str) -> np.dtype:
    dtype = np.dtype(spec)
    if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        raise TypeError(f"a direct channel carries arrays of plain dtypes (numbers, bools, dates, bytes, text), not "
                        f"{dtype!r}: send objects in lists, records as separate arrays")
    return dtype


def _rebuild_array(data: Any, spec: str, shape: Tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=_plain_dtype(spec)).reshape(shape)  # writable: data is a bytearray


def _rebuild_scalar(spec: str, data: bytes) -> np.generic:
    return np.frombuffer(data, dtype=_plain_dtype(spec))[0]


class _FramePickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            spec = _plain_dtype(obj.dtype.str).str
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)  # bytes out of band, never pickled
            return _rebuild_array, (pickle.PickleBuffer(raw), spec, obj.shape)
        if isinstance(obj, np.generic):
            return _rebuild_scalar, (_plain_dtype(obj.dtype.str).str, obj.tobytes())
        return NotImplemented


def dump_frame(item: Any) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    """``item`` as a frame: its pickle and the raw buffers of its arrays (``TypeError`` for an
    array of objects or records, which the consumer could not load)."""
    buffers: List[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _FramePickler(stream, protocol=5, buffer_callback=buffers.append).dump(item)
    return stream.getvalue(), buffers


# What a frame may name, besides the dataclasses of ``embodied_async.data``: the two rebuilders
# above and a few plain builtins. Nothing here runs code, reads files or takes a raw pointer.
_ADMITTED_GLOBALS = frozenset({
    (__name__, "_rebuild_array"), (__name__, "_rebuild_scalar"),
    *(("builtins", name) for name in ("set", "frozenset", "bytearray", "complex", "slice")),
    ("collections", "OrderedDict"),
})
_MESSAGE_MODULE = messages.__name__


class _MessageUnpickler(pickle.Unpickler):
    """Loads only the types the graph's messages are made of; anything else is an
    ``UnpicklingError`` naming it, raised before it is imported or called."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ADMITTED_GLOBALS:
            return super().find_class(module, name)
        if module == _MESSAGE_MODULE:
            found = getattr(messages, name, None)
            if isinstance(found, type) and dataclasses.is_dataclass(found) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(
            f"a direct channel carries arrays, plain containers and the messages of {_MESSAGE_MODULE}; "
            f"this frame names {module}.{name}, which is refused (a new message type goes in {_MESSAGE_MODULE})")


def load_frame(body: bytearray, buffers: List[bytearray]) -> Any:
    """The item a frame holds (its pickle and out-of-band buffers), through the admitting unpickler."""
    return _MessageUnpickler(io.BytesIO(body), buffers=buffers).load()


def send_all(sock: socket.socket, parts: List[memoryview]) -> None:
    """Write a frame's parts whole (one sendmsg per try, the rest after a partial write)."""
    parts = [p.cast("B") if p.format != "B" or p.ndim != 1 else p for p in parts]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


def recv_exact(sock: socket.socket, size: int, key) -> bytearray:
    """Read exactly ``size`` bytes of ``key``'s connection; EOFError if it closes before."""
    buffer = bytearray(size)
    view, received = memoryview(buffer), 0
    while received < size:
        n = sock.recv_into(view[received:], size - received)
        if n == 0:
            raise EOFError(f"connection of key {key!r} closed mid-message")
        received += n
    return buffer
