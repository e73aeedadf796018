"""Runs that heal: a worker whose process died (SIGKILL, the kernel's OOM killer, a segfault, a
family's simulator process) or that hung (``runner.hang_timeout_s``). An env worker is replaced in
place by the runner (``loop.Runner``: the other workers go on); any other fault ends the run's
attempt with ``WorkerDied`` / ``WorkerHung``, and the run starts again from its last complete
checkpoint in the same log folder (``runner.resume_dir``), every worker fresh. Both count in one
budget, ``runner.restarts_per_hour`` faults in any hour (``faults.Faults``); past it, or at 0, the
run stops as it did before, its error naming every fault. An error a worker raises itself (a bug,
bad data: ``WorkerFailed``) is never healed: it would only repeat. Each restart is a record in
``metrics.jsonl`` and the trackers (``heal/*``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, Optional

from embodied_async import run_folder
from embodied_async.config import Topology, TrainConfig
from embodied_async.runner.faults import Faults, FaultsPastBudget
from embodied_async.runner.loop import Runner
from embodied_async.scheduler.nodes import wait_for_nodes
from embodied_async.scheduler.worker_group import WorkerDied, WorkerFailed, WorkerHung


def run_healing(cfg: TrainConfig, topology: Optional[Topology] = None) -> Dict[str, float]:
    """``Runner(cfg).run()``, started again from the last checkpoint after each fault it may heal."""
    faults = Faults(cfg.runner.restarts_per_hour)
    restart: Optional[Dict] = None  # the record of the restart the next attempt begins with
    heals = cfg.runner.restarts_per_hour > 0
    restarts = 0
    while True:
        runner = Runner(cfg, topology, restart=restart, faults=faults if heals else None)
        try:
            return runner.run()
        except FaultsPastBudget:
            raise
        except (WorkerDied, WorkerHung) as fault:
            if not runner.mode.trains or not heals:
                raise
            faults.admit(fault)
            restarts += 1
            cfg, restart = _restarted(cfg, runner, fault, restarts, len(faults.seen))
            _wait_for_nodes(cfg, runner, fault)
        except WorkerFailed as err:
            if faults.seen:  # the faults healed before it are part of its story
                raise WorkerFailed(f"{err}; faults healed before it: {faults.named()}") from err
            raise


def _restarted(cfg: TrainConfig, runner: Runner, fault: WorkerFailed, count: int, faults: int):
    """The config that resumes from ``runner``'s last checkpoint (its start when it has none), and
    the record of restart number ``count`` (``faults``: those healed so far, this one included)."""
    checkpoint = run_folder.latest_checkpoint(runner.checkpoint_root) or cfg.runner.resume_dir
    resumed_at = run_folder.read_runner_state(checkpoint)["step"]
    lost = runner.state["step"] - resumed_at
    where = f"its last checkpoint {checkpoint}" if checkpoint else "the start (no checkpoint yet)"
    runner.log(f"healing: {fault}; restarting every worker from {where} (fault {faults}, at most "
               f"runner.restarts_per_hour={cfg.runner.restarts_per_hour}; {lost} finished steps are taken again)")
    record = {"step": resumed_at, "heal/restarts": float(count), "heal/faults": float(faults),
              "heal/lost_steps": float(lost),
              "heal/hung": float(isinstance(fault, WorkerHung)), "heal/fault": str(fault),
              "heal/resumed_from": checkpoint, "heal/fault_time": time.time()}
    return dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, resume_dir=checkpoint)), record


def _wait_for_nodes(cfg: TrainConfig, runner: Runner, fault: WorkerFailed) -> None:
    """On several nodes: wait (``runner.node_wait_s``) until the cluster has its nodes again, each
    answering, before the restart places the workers; past that the run stops, naming them."""
    wanted = cfg.cluster.num_nodes
    if cfg.cluster.backend != "ray" or wanted <= 1:
        return
    nodes = wait_for_nodes(wanted, runner.topology.device_kind, cfg.runner.node_wait_s, runner.log)
    if len(nodes) < wanted:
        raise WorkerFailed(f"{fault}; the Ray cluster has {len(nodes)} answering nodes of cluster.num_nodes={wanted} "
                           f"after runner.node_wait_s={cfg.runner.node_wait_s:g} s: not restarted. Start the missing "
                           f"node, then resume with runner.resume_dir={cfg.runner.resume_dir}", fault.worker) from fault
