"""The child side (``python -m embodied_async.isolated.server``, under the family's interpreter):
builds one simulator and answers the env worker's calls on stdin/stdout until told to close or
the pipe closes (the worker ended). Only the standard library, numpy and the family's own code."""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import sys
import traceback
from typing import Any, BinaryIO

from embodied_async.isolated.codec import read_message, write_message
from embodied_async.serial_env import run_chunk

CALLS = ("reset", "step", "observe", "close", "run_chunk")


def _plain(value: Any) -> Any:
    """A ``SubStep`` or ``ChunkResult`` as a dict (its arrays not copied); everything else as it is."""
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The first message names a factory (``"module:callable"``) and its plain config: with
    ``"query"`` the factory's result is the one reply (e.g. the family's task names, for its
    start-up checks); otherwise it is a simulator, served until it is closed."""
    start = read_message(requests)
    module, _, name = start["factory"].partition(":")
    try:
        built = getattr(importlib.import_module(module), name)(start["config"])
    except Exception as err:  # the worker names it: a one-line error, the traceback on stderr
        traceback.print_exc()
        write_message(replies, {"error": f"{type(err).__name__}: {err}"})
        return
    if start.get("query"):
        write_message(replies, {"result": built})
        return
    sub_env = built
    write_message(replies, {"result": {"instruction": sub_env.instruction}})
    while True:
        try:
            request = read_message(requests)
        except EOFError:  # the worker is gone
            break
        call = request.get("call")
        try:
            if call not in CALLS:
                raise ValueError(f"unknown call {call!r}")
            args = request.get("args", [])
            # a whole action chunk in one message: the env worker's other children simulate meanwhile
            result = _plain(run_chunk(sub_env, *args) if call == "run_chunk" else getattr(sub_env, call)(*args))
        except Exception as err:
            traceback.print_exc()
            write_message(replies, {"error": f"{type(err).__name__}: {err}"})
            continue
        write_message(replies, {"result": result})
        if call == "close":
            break


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle: it closes us
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what the simulator prints goes to stderr
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
