"""Where env families keep what they build once and reuse after (reduced meshes, ...):
``$EMBODIED_ASYNC_CACHE`` or ``~/.cache/embodied_async``, a folder per kind. Standard library only:
a family's child process under its own interpreter imports it too."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(kind: str) -> Path:
    base = os.environ.get("EMBODIED_ASYNC_CACHE") or os.path.join(Path.home(), ".cache", "embodied_async")
    return Path(base) / kind
