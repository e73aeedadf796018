"""What every worker process does first: pin its device, limit CPU threads, seed."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from typing import Dict


def setup_worker_process(device_kind: str, device_id: int, cpu_threads: int, seed: int) -> str:
    """Pin this process to its placed device and return the torch device string.

    On a GPU machine the placement id is a GPU: ``CUDA_VISIBLE_DEVICES`` is set before CUDA is
    initialised, so the process sees exactly one GPU as ``cuda:0``. On a CPU machine the id is a
    process slot and only the thread count matters (several processes share few cores).
    """
    import numpy as np
    import torch

    if device_kind == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device_id)
    torch.set_num_threads(max(1, cpu_threads))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return "cuda:0" if device_kind == "gpu" else "cpu"


class BusyTimer:
    """Accumulates busy seconds per named section (``time/env`` etc.); thread-safe pop."""

    def __init__(self) -> None:
        self._totals: Dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._totals[name] += seconds

    def section(self, name: str) -> "_Section":
        return _Section(self, name)

    def pop(self) -> Dict[str, float]:
        with self._lock:
            totals, self._totals = dict(self._totals), defaultdict(float)
        return totals


class _Section:
    def __init__(self, timer: BusyTimer, name: str):
        self.timer, self.name = timer, name

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.timer.add(self.name, time.perf_counter() - self.start)
        return False


class Stopped(Exception):
    """Raised inside a worker loop when it was asked to stop while waiting."""


def wait_future(future, stop: threading.Event, poll: float = 0.5):
    """The future's result; gives up with ``Stopped`` once ``stop`` is set.

    A channel future that times out stays pending, so waiting again in slices is safe.
    """
    while True:
        try:
            return future.result(timeout=poll)
        except TimeoutError:
            if stop.is_set():
                raise Stopped from None
