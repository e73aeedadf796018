"""Messages over a pipe between an env worker and its child simulator: nested dicts, lists,
strings, numbers, booleans, None and numpy arrays of plain dtypes. Nothing is pickled: a frame is
the structure as JSON, with each array replaced by a reference, followed by the arrays' raw bytes.

    frame := u32 header length | header (UTF-8 JSON) | per array: u64 length | raw bytes

Only the standard library and numpy: the child side runs under another interpreter.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO, List

import numpy as np

_ARRAY = "__array__"
# the dtypes an array may have: numbers and booleans (no objects, no records)
PLAIN_KINDS = "biuf"
MAX_HEADER_BYTES = 1 << 24
MAX_ARRAY_BYTES = 1 << 32


class CodecError(ValueError):
    """A frame that is not a message of this codec (damaged, truncated, or of another kind)."""


def _encode(node: Any, arrays: List[np.ndarray]) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, np.generic):
        return node.item()
    if isinstance(node, np.ndarray):
        if node.dtype.kind not in PLAIN_KINDS:
            raise TypeError(f"an array of dtype {node.dtype} cannot be sent: numbers and booleans only")
        arrays.append(np.ascontiguousarray(node))
        return {_ARRAY: len(arrays) - 1, "dtype": node.dtype.str, "shape": list(node.shape)}
    if isinstance(node, (list, tuple)):
        return [_encode(value, arrays) for value in node]
    if isinstance(node, dict):
        if not all(isinstance(key, str) for key in node) or _ARRAY in node:
            raise TypeError(f"dict keys must be strings other than {_ARRAY!r}: {list(node)[:5]}")
        return {key: _encode(value, arrays) for key, value in node.items()}
    raise TypeError(f"a {type(node).__name__} cannot be sent")


def write_message(stream: BinaryIO, message: Any) -> None:
    arrays: List[np.ndarray] = []
    header = json.dumps(_encode(message, arrays), allow_nan=True).encode()
    parts = [struct.pack("<I", len(header)), header]
    for array in arrays:
        parts += [struct.pack("<Q", array.nbytes), array.tobytes()]
    stream.write(b"".join(parts))
    stream.flush()


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError(f"the pipe closed after {0 if data is None else len(data)} of {size} bytes")
    return data


def _decode(node: Any, arrays: List[np.ndarray]) -> Any:
    if isinstance(node, list):
        return [_decode(value, arrays) for value in node]
    if not isinstance(node, dict):
        return node
    if _ARRAY in node:
        return arrays[node[_ARRAY]]
    return {key: _decode(value, arrays) for key, value in node.items()}


def _array_refs(node: Any) -> List[dict]:
    if isinstance(node, list):
        return [ref for value in node for ref in _array_refs(value)]
    if isinstance(node, dict):
        return [node] if _ARRAY in node else [ref for value in node.values() for ref in _array_refs(value)]
    return []


def _read_array(stream: BinaryIO, ref: dict, index: int) -> np.ndarray:
    try:
        dtype, shape = np.dtype(ref["dtype"]), tuple(int(n) for n in ref["shape"])
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"array {index}: a bad reference {ref!r} ({err})") from None
    if ref[_ARRAY] != index or dtype.kind not in PLAIN_KINDS or any(n < 0 for n in shape):
        raise CodecError(f"array {index}: a bad reference {ref!r}")
    (size,) = struct.unpack("<Q", _read_exactly(stream, 8))
    if size > MAX_ARRAY_BYTES or size != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise CodecError(f"array {index}: {size} bytes for a {dtype} array of shape {shape}")
    return np.frombuffer(_read_exactly(stream, size), dtype=dtype).reshape(shape).copy()


def read_message(stream: BinaryIO) -> Any:
    """The next message; EOFError when the other end closed the pipe, CodecError on a bad frame."""
    (length,) = struct.unpack("<I", _read_exactly(stream, 4))
    if length > MAX_HEADER_BYTES:
        raise CodecError(f"a header of {length} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(_read_exactly(stream, length).decode())
    except (UnicodeDecodeError, ValueError) as err:
        raise CodecError(f"an unreadable header ({err})") from None
    arrays = [_read_array(stream, ref, index) for index, ref in enumerate(_array_refs(header))]
    return _decode(header, arrays)
