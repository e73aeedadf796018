"""The runner: one step loop (``loop.Runner``) for every mode: ``ppo`` and ``sft`` train,
``collect`` and ``eval`` train nothing. A mode (``MODES``, chosen by ``runner.mode``) builds its
graph of workers and supplies its step (``graph.Mode``); the loop owns stopping, saving,
evaluation, metrics and Ctrl-C; ``healing.run_healing`` starts it again from its last checkpoint
after a worker's process died or hung. A new mode (e.g. DAgger) is a ``Mode`` subclass and a row of
``MODES`` (and its name in ``config.schema.RUNNER_MODES``); its command is a row of
``cli.COMMANDS``."""

from __future__ import annotations

from typing import Dict, Optional

from embodied_async.config import Topology, TrainConfig
from embodied_async.runner.healing import run_healing
from embodied_async.runner.loop import Runner
from embodied_async.runner.modes import MODES

__all__ = ["MODES", "Runner", "run"]


def run(cfg: TrainConfig, topology: Optional[Topology] = None) -> Dict[str, float]:
    """Train as ``runner.mode`` says; saves the last completed step on a normal end and on Ctrl-C;
    heals the faults of worker processes (``runner.restarts_per_hour``)."""
    return run_healing(cfg, topology)
