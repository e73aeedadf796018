"""Healing in place: an env or rollout worker whose process died or hung is replaced by a new
process on its slot while every other worker goes on (``loop.Runner`` calls ``replace_in_place``
for each such fault). What its link carried is dropped by generation (``data.EnvOutput.generation``):

- an env worker: the new process builds fresh simulators; the rollout worker serving it drops the
  trajectories that env's streams had under way (``RolloutWorker.replace_env``);
- a rollout worker: the new process starts from the weights the actor published last
  (``ActorWorker.resend_weights``, with the counts of what the actor accounted for, where its
  throttle begins), and every env worker it serves starts its episodes anew
  (``EnvWorker.replace_rollout``), the trajectories under way dropped.

Any other fault (the actor, a rollout worker while several actor ranks hold parts of its
trajectories, a worker whose node is lost, a run in one process) is left to
``healing.run_healing``: a restart from the last checkpoint. Both count in the run's one budget (``faults.Faults``)."""

from __future__ import annotations

import time
from typing import Dict, List

from embodied_async.scheduler.nodes import responsive
from embodied_async.scheduler.worker_group import Pending, WorkerFailed, WorkerHung, wait_all

BUILD_TIMEOUT_S = 600.0  # a new process loads its model or builds its simulators
TAKE_IN_TIMEOUT_S = 300.0  # the peers' loops take the replacement in between their steps


def replace_in_place(runner, fault: WorkerFailed) -> bool:
    """Replace the worker ``fault`` names, if it can be done in place; False otherwise (or when
    the run does not heal: ``runner.restarts_per_hour=0``). Past the budget: ``FaultsPastBudget``."""
    component, rank = fault.worker or ("", -1)
    graph, cfg = runner.graph, runner.cfg
    if runner.faults is None or cfg.cluster.backend != "ray" or graph.env is None or graph.rollout is None:
        return False
    if component == "rollout" and runner.topology.actor_world_size != 1:
        return False
    if component not in ("env", "rollout"):
        return False
    node = graph.groups[component].nodes[rank]
    if cfg.cluster.num_nodes > 1 and node not in responsive([node]):
        runner.log(f"{fault}: its node {node} does not answer: the node is lost, every worker on it with it")
        return False  # a restart waits for the cluster's nodes and places every worker anew
    runner.faults.admit(fault)
    found_at = time.time()
    runner.log(f"healing: {fault}; replacing {component}[{rank}] by a new process (fault {len(runner.faults.seen)}, "
               f"at most runner.restarts_per_hour={cfg.runner.restarts_per_hour}); the other workers go on")
    others = [loop for loop in runner.loops if loop.label != f"{component}[{rank}].run"]
    try:
        if component == "env":
            loop, dropped = _replace_env(runner, rank, others)
        else:
            loop, dropped = _replace_rollout(runner, rank, others)
    except (TimeoutError, WorkerFailed) as err:
        raise WorkerFailed(f"{component}[{rank}] could not be replaced after '{fault}': {err}", fault.worker) from err
    runner.loops = [*others, loop]
    gap_s = time.time() - found_at
    runner.log(f"healing: {component}[{rank}] replaced in {gap_s:.1f} s; dropped {dropped['decisions']:.0f} "
               f"decisions ({dropped['samples']:.0f} samples) of the trajectories under way")
    runner.metric_logger.log({  # at once: a run that fails later still shows it
        "step": runner.state["step"], "heal/replaced": f"{component}[{rank}]", "heal/fault": str(fault),
        "heal/hung": float(isinstance(fault, WorkerHung)), "heal/faults": float(len(runner.faults.seen)),
        "heal/lost_decisions": dropped["decisions"], "heal/lost_samples": dropped["samples"], "heal/gap_s": gap_s})
    return True


def _next_generation(runner, env_rank: int) -> int:
    runner.link_generations[env_rank] = runner.link_generations.get(env_rank, 0) + 1
    return runner.link_generations[env_rank]


def _replace_env(runner, rank: int, others: List[Pending]) -> tuple:
    graph = runner.graph
    generation = _next_generation(runner, rank)
    graph.env.replace(rank, generation=generation)
    wait_all([graph.env.call_rank(rank, "spec")], watch=others, timeout=BUILD_TIMEOUT_S)
    serving = rank // runner.topology.env_workers_per_rollout
    dropped = wait_all([graph.rollout.call_rank(serving, "replace_env", rank, generation)], watch=others,
                       timeout=TAKE_IN_TIMEOUT_S)[0]
    return graph.env.call_rank(rank, "run"), dropped


def _replace_rollout(runner, rank: int, others: List[Pending]) -> tuple:
    graph = runner.graph
    generations = {env_rank: _next_generation(runner, env_rank) for env_rank in runner.topology.env_ranks(rank)}
    graph.rollout.replace(rank, link_generations=generations)
    wait_all([graph.rollout.call_rank(rank, "heartbeat")], watch=others, timeout=BUILD_TIMEOUT_S)
    loop = graph.rollout.call_rank(rank, "run")
    parts = wait_all([graph.env.call_rank(env_rank, "replace_rollout", generation)
                      for env_rank, generation in generations.items()], watch=[*others, loop],
                     timeout=TAKE_IN_TIMEOUT_S)
    wait_all([graph.actor.call_rank(0, "resend_weights", rank)], watch=[*others, loop], timeout=TAKE_IN_TIMEOUT_S)
    if runner.eval_in_flight is not None and runner.eval_in_flight.label.startswith(f"rollout[{rank}]."):
        runner.eval_in_flight = None  # it died with the process
        runner.log("the evaluation in flight ended with the rollout worker; the next runs at its interval")
    dropped: Dict[str, float] = {key: sum(part[key] for part in parts) for key in ("decisions", "samples")}
    return loop, dropped
