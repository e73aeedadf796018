"""``runner.dry_run``: the plan of a run, printed without starting anything.

What goes where (processes per device), the batch arithmetic of one update, and a memory
estimate per GPU made of the families' own estimates (``ModelConfig.memory_estimate``,
``EnvConfig.memory_estimate``) plus a CUDA context per process. Estimates are arithmetic on
parameter counts and shapes, not measurements: ``scripts/gpu_check.py`` measures on a real GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from embodied_async.config.batches import update_batches
from embodied_async.config.placement import parse_device_ids
from embodied_async.config.schema import TrainConfig
from embodied_async.config.topology import Topology

GIB = 2**30
CUDA_CONTEXT_BYTES = 0.5 * GIB  # per process that touches a GPU (driver, kernels, allocator)


@dataclass(frozen=True)
class Workload:
    """What a family needs to size its memory: batches as one process sees them."""

    rollout_batch: int  # sub-envs in one rollout policy batch (one stage)
    eval_batch: int  # sub-envs of the evaluation env (rollout rank 0)
    actor_micro_batch: int  # samples per forward/backward on one actor rank
    actor_world_size: int  # FSDP ranks the trained state is sharded over
    envs_per_process: int  # sub-envs one env process simulates (all its stages)


def planned_num_gpus(cfg: TrainConfig) -> int:
    """GPUs the placement names (a dry run plans for that machine, not this one)."""
    ids: List[int] = []
    for spec in dict(cfg.cluster.component_placement).values():
        if str(spec).strip() == "all":
            raise ValueError("runner.dry_run plans for the GPUs the placement names: write ids ('0-3'), not 'all'")
        ids += parse_device_ids(spec)
    return max(ids) + 1 if ids else 0


def workload(cfg: TrainConfig, topology: Topology) -> Workload:
    return Workload(rollout_batch=topology.envs_per_stage, eval_batch=cfg.runner.eval_num_envs,
                    actor_micro_batch=update_batches(cfg, topology.actor_world_size).micro,
                    actor_world_size=topology.actor_world_size,
                    envs_per_process=topology.envs_per_stage * topology.stages)


def started_ranks(cfg: TrainConfig, topology: Topology) -> Dict[str, int]:
    """Processes each component runs: a supervised run starts no env workers, and a rollout
    worker only to evaluate (rank 0 evaluates)."""
    if cfg.runner.mode == "sft":
        return {"env": 0, "rollout": 1 if cfg.runner.val_check_interval else 0,
                "actor": len(topology.ids("actor"))}
    return {c: len(topology.ids(c)) for c in ("env", "rollout", "actor")}


def _placement_lines(cfg: TrainConfig, topology: Topology) -> List[str]:
    unit = "GPU" if topology.device_kind == "gpu" else "CPU slot"
    devices: Dict[int, List[str]] = {}
    counts = started_ranks(cfg, topology)
    for component in ("env", "rollout", "actor"):
        for rank, device in enumerate(topology.ids(component)[:counts[component]]):
            devices.setdefault(device, []).append(f"{component} {rank}")
    lines = [f"  {unit} {device}: {', '.join(names)}" for device, names in sorted(devices.items())]
    lines.append(f"  processes: {sum(counts.values())} ({counts['env']} env, {counts['rollout']} rollout, "
                 f"{counts['actor']} actor ranks), plus the runner")
    return lines


def _supervised_lines(cfg: TrainConfig, topology: Topology) -> List[str]:
    batches = update_batches(cfg, topology.actor_world_size)
    per_rank, micro = batches.per_rank, batches.micro
    sft = cfg.sft
    schedule = f"{sft.lr_schedule} to {sft.min_lr_ratio} x actor.lr" if sft.lr_schedule == "cosine" else "constant"
    return [f"  dataset: {cfg.dataset.root} ({cfg.dataset.validation_fraction:.0%} of its episodes held out)",
            f"  one step: {cfg.actor.global_batch_size} frames; per actor rank {per_rank} = {per_rank // micro} "
            f"micro-batches of {micro}",
            f"  {cfg.runner.max_steps} steps; learning rate {cfg.actor.lr:g}: {sft.lr_warmup_steps} warm-up steps, "
            f"then {schedule}"]


def _batch_lines(cfg: TrainConfig, topology: Topology) -> List[str]:
    if cfg.runner.mode == "sft":
        return _supervised_lines(cfg, topology)
    store = cfg.algorithm.rollout_store_size_per_rank
    batches = update_batches(cfg, topology.actor_world_size)
    decisions, minibatches, steps = batches.decisions, batches.minibatches, batches.optimizer_steps
    per_rank, micro = batches.per_rank, batches.micro
    lines = [
        f"  sub-envs: {cfg.env.num_envs} = {topology.num_env_workers} env processes x {topology.stages} stages x "
        f"{topology.envs_per_stage}; a rollout policy batch: {topology.envs_per_stage} sub-envs "
        "(one stage of one env process)",
        f"  one update: {store} x {cfg.env.num_envs} sub-envs x {cfg.rollout.num_steps} steps = {decisions} "
        f"decisions ({decisions * cfg.env.num_action_chunks} env steps)",
        f"  minibatches: {minibatches} of {cfg.actor.global_batch_size} per epoch x {cfg.algorithm.update_epochs} "
        f"epochs = {steps} optimiser steps per update",
        f"  per actor rank: {per_rank} samples per minibatch = {per_rank // micro} micro-batches of {micro}",
    ]
    if cfg.actor.critic_warmup_steps:
        updates = math.ceil(cfg.actor.critic_warmup_steps / max(steps, 1))
        lines.append(f"  critic warm-up: {cfg.actor.critic_warmup_steps} optimiser steps (~{updates} updates) "
                     "train the value head alone")
    if cfg.actor.policy_lr_warmup_steps:
        lines.append(f"  policy learning rate: rises linearly to {cfg.actor.lr:g} over the first "
                     f"{cfg.actor.policy_lr_warmup_steps} policy steps")
    alg = cfg.algorithm
    if alg.staleness_control == "kl":
        start = min(max(alg.staleness_threshold, alg.staleness_min), alg.staleness_max)
        lines.append(f"  staleness: follows the behaviour KL, starting at {start} version(s) ahead, within "
                     f"[{alg.staleness_min}, {alg.staleness_max}]: raised after {alg.staleness_kl_patience} updates "
                     f"in a row under {alg.staleness_kl_low:g}, lowered after as many over {alg.staleness_kl_high:g}")
    else:
        lines.append(f"  staleness: the rollout runs at most {alg.staleness_threshold} version(s) ahead")
    if alg.batch_from == "first_arrived":
        lines.append(f"  batch: the first {store * len(topology.streams)} trajectories to arrive, from any "
                     "stream (a slow env worker's share is filled by the others)")
    return lines


def _add(total: Dict[str, float], part: Optional[Dict[str, float]], label: str) -> None:
    for name, value in (part or {}).items():
        total[f"{label} {name}"] = total.get(f"{label} {name}", 0.0) + value


def memory_per_device(cfg: TrainConfig, topology: Topology) -> Dict[int, Dict[str, float]]:
    """Bytes per GPU and item ("rollout weights", "actor optimiser", ...)."""
    work = workload(cfg, topology)
    model = cfg.model.memory_estimate(work) or {}
    env = cfg.env.memory_estimate(work) or {}
    # evaluation runs in rollout rank 0's process, on its own env of runner.eval_num_envs sub-envs
    evaluation = dict(model.get("evaluation") or {})
    _add(evaluation, cfg.env.memory_estimate(replace(work, envs_per_process=work.eval_batch)), "env")
    per_device: Dict[int, Dict[str, float]] = {}
    counts = started_ranks(cfg, topology)
    for component, part in (("env", env), ("rollout", model.get("rollout")), ("actor", model.get("actor"))):
        for rank, device in enumerate(topology.ids(component)[:counts[component]]):
            items = per_device.setdefault(device, {})
            if component == "rollout" and rank == 0:
                _add(items, evaluation, "evaluation")
            _add(items, part, component)
            _add(items, {"CUDA context": CUDA_CONTEXT_BYTES}, component)
    return per_device


def _memory_lines(cfg: TrainConfig, topology: Topology) -> List[str]:
    if topology.device_kind != "gpu":
        return ["  (CPU placement: no GPU memory to plan)"]
    model_known = cfg.model.memory_estimate(workload(cfg, topology)) is not None
    lines = []
    for device, items in sorted(memory_per_device(cfg, topology).items()):
        total = sum(items.values())
        lines.append(f"  GPU {device}: {total / GIB:.1f} GiB")
        for name, value in sorted(items.items(), key=lambda kv: -kv[1]):
            if value >= 0.05 * GIB:
                lines.append(f"    {name:<48} {value / GIB:7.2f} GiB")
    if not model_known:
        lines.append(f"  (model family '{cfg.model.name}' gives no memory estimate: weights not counted)")
    startup = (cfg.model.memory_estimate(workload(cfg, topology)) or {}).get("startup", {})
    for name, value in startup.items():
        lines.append(f"  start-up: +{value / GIB:.1f} GiB per actor rank for a moment ({name})")
    notes = list(cfg.model.memory_notes()) + list(cfg.env.memory_notes())
    return lines + [f"  note: {note}" for note in notes]


def describe(cfg: TrainConfig, topology: Topology) -> str:
    """The whole plan as text."""
    sections = [("placement", _placement_lines(cfg, topology)), ("batches", _batch_lines(cfg, topology)),
                ("memory estimate per GPU", _memory_lines(cfg, topology))]
    out = [f"[dry run] model {cfg.model.name}, env {cfg.env.name}, device {topology.device_kind}; nothing started"]
    for title, lines in sections:
        out.append(f"{title}:")
        out.extend(lines)
    return "\n".join(out)
