"""The faults a run heals, counted over all its attempts: at most ``runner.restarts_per_hour`` in
any hour, whether the cure was a new process for one env worker (``loop.Runner``) or a restart of
the whole run from its last checkpoint (``healing.run_healing``). Past that the run stops, naming
every fault."""

from __future__ import annotations

import time
from typing import List

from embodied_async.scheduler.worker_group import WorkerFailed

HOUR_S = 3600.0


class FaultsPastBudget(WorkerFailed):
    """More faults within an hour than ``runner.restarts_per_hour`` allows: the run stops as a
    fault without healing does, its message naming each one."""


class Faults:
    """The faults of a run so far (when, what)."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self.seen: List[tuple] = []  # (time.monotonic(), message)

    def admit(self, fault: Exception) -> None:
        """Count ``fault``; ``FaultsPastBudget`` when the budget allows no more healing."""
        now = time.monotonic()
        self.seen.append((now, str(fault)))
        if sum(1 for when, _ in self.seen if now - when <= HOUR_S) > self.per_hour:
            raise FaultsPastBudget(f"{len(self.seen)} faults within an hour, past runner.restarts_per_hour="
                                   f"{self.per_hour}: stopping. The faults: {self.named()}") from fault

    def named(self) -> str:
        return "; ".join(f"({index}) {message}" for index, (_, message) in enumerate(self.seen, 1))
