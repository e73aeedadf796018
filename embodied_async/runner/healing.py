"""Runs that heal: a worker whose process died (SIGKILL, the kernel's OOM killer, a segfault, a
family's simulator process) or that hung (``runner.hang_timeout_s``) ends the run's attempt with
``WorkerDied`` / ``WorkerHung``; the run then starts again from its last complete checkpoint in the
same log folder (``runner.resume_dir``), every worker fresh, at most ``runner.restarts_per_hour``
times in any hour. Past that budget, or at 0, the run stops as it did before, its error naming
every fault. An error a worker raises itself (a bug, bad data: ``WorkerFailed``) is never healed:
it would only repeat. Each restart is a record in ``metrics.jsonl`` and the trackers (``heal/*``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

from embodied_async import run_folder
from embodied_async.config import Topology, TrainConfig
from embodied_async.runner.loop import Runner
from embodied_async.scheduler.worker_group import WorkerDied, WorkerFailed, WorkerHung

HOUR_S = 3600.0


class Faults:
    """The faults of a run so far (when, what), and whether one more may be healed."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self.seen: List[tuple] = []  # (time.monotonic(), message)

    def add(self, message: str) -> bool:
        """Count a fault; True when the budget allows a restart for it."""
        now = time.monotonic()
        self.seen.append((now, message))
        return sum(1 for when, _ in self.seen if now - when <= HOUR_S) <= self.per_hour

    def named(self) -> str:
        return "; ".join(f"({index}) {message}" for index, (_, message) in enumerate(self.seen, 1))


def run_healing(cfg: TrainConfig, topology: Optional[Topology] = None) -> Dict[str, float]:
    """``Runner(cfg).run()``, started again from the last checkpoint after each fault it may heal."""
    faults = Faults(cfg.runner.restarts_per_hour)
    restart: Optional[Dict] = None  # the record of the restart the next attempt begins with
    while True:
        runner = Runner(cfg, topology, restart=restart)
        try:
            return runner.run()
        except (WorkerDied, WorkerHung) as fault:
            if not runner.mode.trains or cfg.runner.restarts_per_hour == 0:
                raise
            allowed = faults.add(str(fault))
            if not allowed:
                raise type(fault)(f"{len(faults.seen)} faults within an hour, past runner.restarts_per_hour="
                                  f"{cfg.runner.restarts_per_hour}: stopping. The faults: {faults.named()}") from fault
            cfg, restart = _restarted(cfg, runner, fault, len(faults.seen))
        except WorkerFailed as err:
            if faults.seen:  # the faults healed before it are part of its story
                raise WorkerFailed(f"{err}; faults healed before it: {faults.named()}") from err
            raise


def _restarted(cfg: TrainConfig, runner: Runner, fault: WorkerFailed, count: int):
    """The config that resumes from ``runner``'s last checkpoint (its start when it has none), and
    the restart's record."""
    checkpoint = run_folder.latest_checkpoint(runner.checkpoint_root) or cfg.runner.resume_dir
    resumed_at = run_folder.read_runner_state(checkpoint)["step"]
    lost = runner.state["step"] - resumed_at
    where = f"its last checkpoint {checkpoint}" if checkpoint else "the start (no checkpoint yet)"
    runner.log(f"healing: {fault}; restarting every worker from {where} (restart {count}, at most "
               f"runner.restarts_per_hour={cfg.runner.restarts_per_hour}; {lost} finished steps are taken again)")
    record = {"step": resumed_at, "heal/restarts": float(count), "heal/lost_steps": float(lost),
              "heal/hung": float(isinstance(fault, WorkerHung)), "heal/fault": str(fault),
              "heal/resumed_from": checkpoint, "heal/fault_time": time.time()}
    return dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, resume_dir=checkpoint)), record
