"""Worker processes under Ray: one that was stopped (SIGSTOP: a wedged simulator or renderer)
does not exit when Ray asks it to, so replacing it, or shutting the group down, kills it by its
pid; otherwise it would hold its memory (GBs for a VLA or a LIBERO env) until the run ends."""

import os
import signal
import sys
import time
from types import SimpleNamespace

import pytest
import ray

from embodied_async.scheduler.worker_group import WorkerGroup

pytestmark = pytest.mark.slow  # starts Ray


class Worker:
    def __init__(self, device_id: int):
        self.device_id = device_id

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> None:  # a worker's loop, under way when the process is stopped
        while True:
            time.sleep(0.01)


def gone(pid: int, within: float = 15.0) -> bool:
    """Ended (or a zombie its parent has not reaped yet) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


def test_a_stopped_worker_process_is_killed_when_replaced_and_at_shutdown():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        topology = SimpleNamespace(ids=lambda name: [0], device_kind="cpu")
        group = WorkerGroup("env", Worker, topology, "ray", kwargs_for=lambda rank: {})
        first = group.call_rank(0, "pid").result(timeout=60)
        group.call_rank(0, "run")
        os.kill(first, signal.SIGSTOP)
        group.replace(0)
        second = group.call_rank(0, "pid").result(timeout=60)
        assert second != first and gone(first)
        group.call_rank(0, "run")
        os.kill(second, signal.SIGSTOP)
        group.shutdown()
        assert gone(second)
    finally:
        ray.shutdown()
