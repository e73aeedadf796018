"""What every worker process does first: pin its device, limit CPU threads, seed."""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from collections import defaultdict
from typing import Dict, Hashable, Iterator, List, Optional, Sequence, Tuple


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
    """Accumulates seconds per named section (``time/env`` etc.): wall seconds under the name,
    and the CPU seconds of the timing thread under ``<name>_cpu`` (on a shared core the two
    differ: wall time includes waiting for the core). Thread-safe pop. The sections open now are
    the worker's heartbeat (``busy``): one open for too long is a hung worker."""

    def __init__(self) -> None:
        self._totals: Dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._open: Dict[int, tuple] = {}  # thread id -> (section, when it opened: time.monotonic())

    def busy(self, waiting: Sequence[str] = ("wait",)) -> Optional[Tuple[str, float]]:
        """The section open longest, but those of ``waiting`` (a peer's hang, not this worker's),
        and for how many seconds; None when the worker is in none."""
        now = time.monotonic()
        with self._lock:
            opened = [(name, now - since) for name, since in self._open.values() if name not in waiting]
        return max(opened, key=lambda item: item[1]) if opened else None

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        with self._lock:
            self._totals[name] += seconds
            self._totals[name + "_cpu"] += cpu_seconds

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
        self.start, self.start_cpu = time.perf_counter(), time.thread_time()
        with self.timer._lock:
            self.outer = self.timer._open.get(threading.get_ident())
            self.timer._open[threading.get_ident()] = (self.name, time.monotonic())
        return self

    def __exit__(self, *exc):
        with self.timer._lock:
            if self.outer is None:
                self.timer._open.pop(threading.get_ident(), None)
            else:
                self.timer._open[threading.get_ident()] = self.outer
        self.timer.add(self.name, time.perf_counter() - self.start, time.thread_time() - self.start_cpu)
        return False


def _descendants(pid: int) -> List[int]:
    """The live processes below ``pid`` (``/proc/<pid>/task/<tid>/children``; none where the
    kernel does not list children)."""
    found: List[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def children_cpu_s() -> float:
    """CPU seconds of this process's child processes, live and reaped: where a family's
    simulators run in children (``embodied_async.isolated``), their CPU is the env's work."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile: counted by getrusage once reaped
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + reaped.ru_utime + reaped.ru_stime


class ProcessClock:
    """CPU seconds of this whole process (every thread: the worker loop, Ray's and torch's) and of
    its child processes, and wall seconds, since the last ``pop``."""

    def __init__(self) -> None:
        self._cpu, self._children, self._wall = time.process_time(), children_cpu_s(), time.perf_counter()

    def pop(self) -> Dict[str, float]:
        cpu, children, wall = time.process_time(), children_cpu_s(), time.perf_counter()
        out = {"cpu": cpu - self._cpu + children - self._children, "children_cpu": children - self._children,
               "wall": wall - self._wall}
        self._cpu, self._children, self._wall = cpu, children, wall
        return out


def process_metrics(component: str, clock: ProcessClock, work_cpu_s: float, *channels) -> Dict[str, float]:
    """A worker's CPU accounting since the last call: ``cpu/<component>_work`` (the CPU its own
    work took: simulation, inference, training; its child processes' CPU included),
    ``cpu/<component>_process`` (the whole process and its children: work plus messaging, Ray's
    threads, polling), the traffic it sent through ``channels`` and the
    connections to its channels it refused (peers that are not the run's processes). Workers of
    one component are added up."""
    process = clock.pop()
    # a child process works for its parent (the simulators of an isolated env family)
    out = {f"cpu/{component}_work": work_cpu_s + process["children_cpu"], f"cpu/{component}_process": process["cpu"]}
    for what in ("messages", "bytes", "refused_connections"):
        out[f"traffic/{component}_{what}"] = 0.0
    for channel in channels:
        for what, count in channel.pop_traffic().items():
            out[f"traffic/{component}_{what}"] += count
    return out


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


class HandOver:
    """Replacements of a worker's peers that its own loop takes in between its steps: the runner's
    call ``ask``s (one request per key, e.g. the replaced env rank, with the new process's link
    generation) and waits; the loop ``take``s the requests, drops what the old peer had under way,
    fills in what it dropped, and the call returns that."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Dict[Hashable, tuple] = {}  # key -> (generation, taken: Event, what was dropped)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def ask(self, key: Hashable, generation: int, timeout_s: float, what: str) -> Dict[str, float]:
        taken, dropped = threading.Event(), {}
        with self._lock:
            self._requests[key] = (generation, taken, dropped)
        if not taken.wait(timeout_s):
            raise TimeoutError(f"{what}: its loop did not take it in within {timeout_s:.0f} s")
        return dropped

    def take(self) -> Iterator[Tuple[Hashable, int, Dict[str, float]]]:
        """``(key, generation, dropped)`` of each request; the loop fills ``dropped`` in, and the
        request is answered once the loop asks for the next."""
        with self._lock:
            requests, self._requests = self._requests, {}
        for key, (generation, taken, dropped) in requests.items():
            yield key, generation, dropped
            taken.set()
