"""The topology of a run, resolved once at start-up from ``cluster.component_placement``.

``resolve_topology`` parses the placement against this machine's devices, checks that the
sub-envs divide evenly over the placed processes, and returns a frozen ``Topology``: the runner
and every worker read who serves whom from it, nothing recomputes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from embodied_async.config.checks import ConfigError, require
from embodied_async.config.family_hooks import hook
from embodied_async.config.placement import DEFAULT_COMPONENTS as COMPONENTS
from embodied_async.config.placement import PlacementError, detect_num_gpus, parse_placement


@dataclass(frozen=True)
class Topology:
    device_kind: str  # "gpu": ids are GPUs; "cpu": ids are CPU process slots
    env_ids: Tuple[int, ...]
    rollout_ids: Tuple[int, ...]
    actor_ids: Tuple[int, ...]
    stages: int  # pipeline stages per env worker (env.pipeline_stage_num)
    envs_per_stage: int  # sub-envs one env worker steps in each stage
    env_workers_per_rollout: int  # env workers each rollout worker serves

    def ids(self, component: str) -> List[int]:
        """Device ids of ``component`` ("env", "rollout", "actor"), one process each."""
        return list(getattr(self, f"{component}_ids"))

    @property
    def num_env_workers(self) -> int:
        return len(self.env_ids)

    @property
    def num_rollout_workers(self) -> int:
        return len(self.rollout_ids)

    @property
    def actor_world_size(self) -> int:
        return len(self.actor_ids)

    def env_ranks(self, rollout_rank: int) -> List[int]:
        """The env workers rollout worker ``rollout_rank`` serves (a contiguous block)."""
        per_rollout = self.env_workers_per_rollout
        return list(range(rollout_rank * per_rollout, (rollout_rank + 1) * per_rollout))

    def stream_env_keys(self, rollout_rank: int) -> List[Tuple[int, int]]:
        """The (env rank, stage) that each stream of rollout worker ``rollout_rank`` serves, in
        stream order: a stream is one pipeline stage of one env worker, with its own policy batch
        (acted for as soon as its observations arrive) and its own ordered trajectories."""
        return [(env_rank, stage) for env_rank in self.env_ranks(rollout_rank) for stage in range(self.stages)]

    @property
    def streams(self) -> List[Tuple[int, int]]:
        """(rollout rank, that worker's stream index), over all rollout workers."""
        per_rollout = self.env_workers_per_rollout * self.stages
        return [(r, i) for r in range(self.num_rollout_workers) for i in range(per_rollout)]


def _parse(cfg, num_gpus: Optional[int]):
    if num_gpus is None:
        num_gpus = detect_num_gpus()
    kind = cfg.cluster.device_type
    if kind == "auto":
        kind = "gpu" if num_gpus > 0 else "cpu"
    if kind == "gpu" and num_gpus == 0 and cfg.cluster.num_nodes == 1 and not os.environ.get("RAY_ADDRESS"):
        recipe = hook(cfg.model, "cpu_recipe")
        suggestion = f"'bash scripts/run_async.sh {recipe}'" if recipe else "one listed by 'ls configs/'"
        raise ConfigError(f"cluster.device_type=gpu asks for GPUs, but this machine has none (the placement names "
                          f"{dict(cfg.cluster.component_placement)}). Use a CPU recipe such as {suggestion}, "
                          "or cluster.device_type=auto.")
    try:
        ids = parse_placement(dict(cfg.cluster.component_placement),
                              num_devices=num_gpus if kind == "gpu" and cfg.cluster.num_nodes == 1 else None,
                              device_kind=kind, required=COMPONENTS)
    except PlacementError as err:
        raise ConfigError(str(err)) from None
    return kind, ids


def _check_backend(cfg, kind: str, ids) -> None:
    """Components may share ids: with cluster.backend=ray, components co-located on a GPU take turns
    on it, and CPU ids are only process slots. cluster.backend=local runs the whole graph in this one
    process: it holds a single actor rank and sees a single GPU."""
    if cfg.cluster.backend != "local":
        return
    require(len(ids["actor"]) == 1,
            f"cluster.component_placement places actor on {len(ids['actor'])} ids {ids['actor']}, "
            "but cluster.backend=local runs one actor rank in this process: place actor on a single id "
            "(e.g. 'actor': '0'), or use cluster.backend=ray for several ranks")
    if kind == "gpu":
        all_ids = sorted({i for c in COMPONENTS for i in ids[c]})
        require(len(all_ids) == 1,
                f"cluster.component_placement uses GPUs {all_ids}, but cluster.backend=local runs in one process, "
                "which sees one GPU: place every component on the same GPU id (e.g. {'env,rollout,actor': '0'}), "
                "or use cluster.backend=ray")


def _check_envs(cfg, num_env: int, num_rollout: int) -> None:
    stages = cfg.env.pipeline_stage_num
    require(cfg.env.num_envs % (num_env * stages) == 0,
            f"env.num_envs={cfg.env.num_envs} must divide evenly over {num_env} env processes x "
            f"{stages} pipeline stages (env.pipeline_stage_num); use a multiple of {num_env * stages}")
    require(num_env % num_rollout == 0,
            f"the {num_env} env processes must split evenly over the {num_rollout} rollout "
            "processes (cluster.component_placement); place a multiple of the rollout count on env")


def _check_actor_shards(topology: Topology) -> None:
    """Every stream's trajectory is split into one shard per actor rank."""
    batch, world = topology.envs_per_stage, topology.actor_world_size
    require(batch % world == 0,
            f"each stream's batch (one pipeline stage of one env process: {batch} sub-envs) must split evenly "
            f"over the {world} actor ranks; make env.num_envs a multiple of "
            f"{topology.num_env_workers * topology.stages * world}")


def resolve_topology(cfg, num_gpus: Optional[int] = None) -> Topology:
    """Parse and check the placement of ``cfg`` (a TrainConfig) on this machine (``num_gpus``:
    GPUs to assume instead of probing). Raises ``ConfigError`` naming the key and the fix."""
    kind, ids = _parse(cfg, num_gpus)
    _check_backend(cfg, kind, ids)
    num_env, num_rollout = len(ids["env"]), len(ids["rollout"])
    _check_envs(cfg, num_env, num_rollout)
    stages = cfg.env.pipeline_stage_num
    topology = Topology(device_kind=kind, env_ids=tuple(ids["env"]), rollout_ids=tuple(ids["rollout"]),
                        actor_ids=tuple(ids["actor"]), stages=stages,
                        envs_per_stage=cfg.env.num_envs // num_env // stages,
                        env_workers_per_rollout=num_env // num_rollout)
    _check_actor_shards(topology)
    return topology
