"""What a command prints and exits with when it meets an error: one table for every command.

Bad input (a config, checkpoint, dataset or folder that cannot be used) exits 2, a run that could
not go on (a full disk, a worker that died) exits 1, Ctrl-C exits 130; each as one line naming the
problem and the fix, never a traceback. Rows name the error classes by their qualified names, so
the table costs no import (the training launcher stays light).
"""

from __future__ import annotations

import sys
from typing import Optional, Tuple


class CommandError(Exception):
    """Bad input a command found itself (an argument, an env it cannot build): printed as
    ``<command> error: ...``, exit code 2."""


# (error class, the line's prefix ("{command}": the command's name), exit code); the first row
# whose class the error is an instance of applies
ERROR_KINDS: Tuple[Tuple[str, str, int], ...] = (
    ("embodied_async.cli.errors.CommandError", "{command} error", 2),
    ("embodied_async.config.checks.ConfigError", "config error", 2),
    ("embodied_async.private_files.FolderRefused", "config error", 2),
    ("embodied_async.checkpoint_io.CheckpointError", "checkpoint error", 2),
    ("embodied_async.datasets.lerobot_format.DatasetError", "dataset error", 2),
    ("embodied_async.export.ExportError", "export error", 2),
    ("embodied_async.run_folder.StorageError", "storage error", 1),
    ("embodied_async.scheduler.worker_group.WorkerFailed", "[{command}] a worker failed, stopping the run", 1),
    ("embodied_async.pipeline.PhaseFailed", "[{command}] a phase failed", 1),
    ("builtins.KeyboardInterrupt", "[{command}] stopped by Ctrl-C", 130),
)


def error_kind(err: BaseException) -> Optional[Tuple[str, int]]:
    """``(prefix, exit code)`` of ``err``'s row, or None for an error no row names (a bug: it keeps
    its traceback)."""
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(err).__mro__}
    return next(((prefix, code) for name, prefix, code in ERROR_KINDS if name in names), None)


def report(err: BaseException, command: str, note: str = "") -> int:
    """Print ``err`` as its row's one line (``note`` added after a semicolon) and return its exit
    code; re-raise an error no row names."""
    kind = error_kind(err)
    if kind is None:
        raise err
    prefix, code = kind
    # an error raised in a worker process reaches here wrapped by Ray: its own message, not Ray's
    message = str(getattr(err, "cause", None) or err)
    line = prefix.format(command=command) + (f": {message}" if message else "") + (f"; {note}" if note else "")
    print(line, file=sys.stderr, flush=True)
    return code
