"""Turn a composed (Hydra/OmegaConf) config into a validated ``TrainConfig``.

Everything here runs before any worker starts, so a bad config costs seconds, not a run. Each error
names the key path and how to fix it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from embodied_async.config.schema import TrainConfig
from embodied_async.registry import KNOWN_ENVS, KNOWN_MODELS


# the recipe to point to when a GPU recipe meets a machine without GPUs
CPU_RECIPES = {"openvla": "maniskill_async_ppo_openvla_tiny"}


class ConfigError(ValueError):
    """A configuration problem found at start-up; the message names the key and the fix."""


def _valid_keys_at(path: str) -> list[str]:
    node: Any = TrainConfig()
    for part in [p for p in path.split(".") if p]:
        node = getattr(node, part, None)
        if node is None or not dataclasses.is_dataclass(node):
            return []
    return [f.name for f in dataclasses.fields(node)]


def _reject_unknown_keys(node: Any, schema_type: type, path: str) -> None:
    """Walk the plain config against the dataclasses (free-form dict fields are not walked)."""
    fields = {f.name: f for f in dataclasses.fields(schema_type)}
    for key, value in node.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            while isinstance(value, dict) and len(value) == 1:  # name the whole path given
                key, value = next(iter(value.items()))
                full = f"{full}.{key}"
            raise ConfigError(
                f"unknown config key '{full}'. Valid keys under '{path or '<top level>'}': "
                f"{', '.join(fields)}. Fix the spelling or remove it."
            )
        default = getattr(schema_type(), key)
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            _reject_unknown_keys(value, type(default), full)


def to_train_config(cfg: Any) -> TrainConfig:
    """Merge ``cfg`` (DictConfig or dict) into the schema and return a checked ``TrainConfig``."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    plain = OmegaConf.to_container(cfg, resolve=False)
    _reject_unknown_keys(plain, TrainConfig, "")
    schema = OmegaConf.structured(TrainConfig)
    try:
        merged = OmegaConf.merge(schema, cfg)
    except ConfigKeyError as err:
        key = err.full_key or str(err.key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        valid = _valid_keys_at(parent)
        raise ConfigError(
            f"unknown config key '{key}'. Valid keys under '{parent or '<top level>'}': "
            f"{', '.join(valid)}. Fix the spelling or remove it."
        ) from None
    except ValidationError as err:
        raise ConfigError(
            f"bad value for config key '{err.full_key}': {err.msg.splitlines()[0]}. "
            "Give a value of the type the schema declares (embodied_async/config/schema.py)."
        ) from None
    except OmegaConfBaseException as err:  # interpolation errors and the like
        raise ConfigError(f"config error at '{getattr(err, 'full_key', '?')}': {err}") from None
    train_cfg: TrainConfig = OmegaConf.to_object(merged)
    check(train_cfg)
    return train_cfg


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _choice(value: Any, key: str, allowed) -> None:
    _require(value in allowed, f"{key}={value!r} is not allowed; use one of: {', '.join(map(str, allowed))}")


def check(cfg: TrainConfig, num_gpus: Optional[int] = None) -> None:
    """Semantic checks that the type system cannot express."""
    from embodied_async.scheduler.placement import PlacementError, detect_num_gpus

    _choice(cfg.cluster.backend, "cluster.backend", ("ray", "local"))
    _choice(cfg.cluster.device_type, "cluster.device_type", ("auto", "cpu", "gpu"))
    _choice(cfg.env.name, "env.name", sorted(KNOWN_ENVS))
    _choice(cfg.model.name, "model.name", sorted(KNOWN_MODELS))
    _choice(cfg.env.obs_mode, "env.obs_mode", ("state", "rgb"))
    _choice(cfg.env.sim_backend, "env.sim_backend", ("cpu", "gpu"))
    _choice(cfg.model.precision, "model.precision", ("float32", "bfloat16"))

    try:
        placement = resolve_placement(cfg, num_gpus)
    except PlacementError as err:
        raise ConfigError(str(err)) from None
    if num_gpus is None:
        num_gpus = detect_num_gpus()

    for key in ("env.num_envs", "rollout.num_steps", "actor.global_batch_size", "actor.micro_batch_size",
                "env.pipeline_stage_num", "env.num_action_chunks", "algorithm.update_epochs",
                "runner.max_steps", "runner.eval_episodes", "runner.eval_num_envs"):
        section, name = key.split(".")
        _require(getattr(getattr(cfg, section), name) > 0, f"{key} must be positive")
    _require(cfg.algorithm.staleness_threshold >= 0, "algorithm.staleness_threshold must be >= 0 (0 = synchronous)")
    _require(0.0 < cfg.algorithm.gamma <= 1.0, "algorithm.gamma must be in (0, 1]")
    _require(0.0 <= cfg.algorithm.gae_lambda <= 1.0, "algorithm.gae_lambda must be in [0, 1]")
    _require(cfg.algorithm.clip_ratio_c > 1.0, "algorithm.clip_ratio_c (dual clip) must be > 1")
    _require(cfg.algorithm.huber_delta > 0, "algorithm.huber_delta must be > 0")
    _require(cfg.actor.max_grad_norm > 0, "actor.max_grad_norm must be > 0 (it clips the gradient norm)")
    if cfg.model.name in ("mlp", "cnn"):
        unused = [key for key, value in (("model.lora.enabled", cfg.model.lora.enabled),
                                         ("model.gradient_checkpointing", cfg.model.gradient_checkpointing),
                                         ("model.path", cfg.model.path),
                                         ("model.tiny_random_init", cfg.model.tiny_random_init)) if value]
        _require(not unused, f"{', '.join(unused)} apply to pretrained models; model.name={cfg.model.name} "
                             "does not use them: remove the override")

    if cfg.cluster.backend == "local" and placement.device_kind == "gpu":
        all_ids = {i for c in ("env", "rollout", "actor") for i in placement.ids(c)}
        _require(len(all_ids) == 1, "cluster.backend=local runs in one process, which sees one GPU: place "
                                    "every component on the same GPU id, or use cluster.backend=ray")
    num_env_procs = len(placement.ids("env"))
    num_rollout_procs = len(placement.ids("rollout"))
    world = len(placement.ids("actor"))
    stages = cfg.env.pipeline_stage_num
    _require(cfg.env.num_envs % (num_env_procs * stages) == 0,
             f"env.num_envs={cfg.env.num_envs} must divide evenly over {num_env_procs} env processes x "
             f"{stages} pipeline stages (env.pipeline_stage_num); use a multiple of {num_env_procs * stages}")
    _require(num_env_procs % num_rollout_procs == 0,
             f"the {num_env_procs} env processes must split evenly over the {num_rollout_procs} rollout "
             "processes; place a multiple of the rollout count on env")
    envs_per_rollout_stage = cfg.env.num_envs // num_rollout_procs // stages
    _require(envs_per_rollout_stage % world == 0,
             f"each rollout stage batch ({envs_per_rollout_stage} sub-envs) must split evenly over the "
             f"{world} actor ranks; make env.num_envs a multiple of {num_rollout_procs * stages * world}")
    batch = cfg.env.num_envs * cfg.rollout.num_steps
    _require(batch % cfg.actor.global_batch_size == 0,
             f"the rollout batch (env.num_envs x rollout.num_steps = {batch}) must be a multiple of "
             f"actor.global_batch_size={cfg.actor.global_batch_size}")
    _require(cfg.actor.global_batch_size % world == 0,
             f"actor.global_batch_size={cfg.actor.global_batch_size} must split evenly over the {world} actor ranks")
    per_rank = cfg.actor.global_batch_size // world
    micro = min(cfg.actor.micro_batch_size, per_rank)
    _require(per_rank % micro == 0,
             f"each actor rank's share of actor.global_batch_size ({per_rank}) must be a multiple of "
             f"actor.micro_batch_size={cfg.actor.micro_batch_size}")
    _require(cfg.runner.eval_episodes % cfg.runner.eval_num_envs == 0,
             f"runner.eval_episodes={cfg.runner.eval_episodes} must be a multiple of "
             f"runner.eval_num_envs={cfg.runner.eval_num_envs}")
    if cfg.runner.resume_dir is not None:
        _require(os.path.isdir(cfg.runner.resume_dir),
                 f"runner.resume_dir={cfg.runner.resume_dir!r} is not a folder; point it at a "
                 "checkpoint folder such as logs/<run>/checkpoints/global_step_50")


def resolve_placement(cfg: TrainConfig, num_gpus: Optional[int] = None):
    """Parse ``cluster.component_placement`` against this machine's devices."""
    from embodied_async.scheduler.placement import PlacementError, Placement, detect_num_gpus, parse_placement

    if num_gpus is None:
        num_gpus = detect_num_gpus()
    kind = cfg.cluster.device_type
    if kind == "auto":
        kind = "gpu" if num_gpus > 0 else "cpu"
    if kind == "gpu" and num_gpus == 0 and cfg.cluster.num_nodes == 1 and not os.environ.get("RAY_ADDRESS"):
        cpu_recipe = CPU_RECIPES.get(cfg.model.name, "maniskill_async_ppo_mlp")
        raise PlacementError(
            f"cluster.device_type=gpu asks for GPUs, but this machine has none (the placement names "
            f"{dict(cfg.cluster.component_placement)}). Use a CPU recipe such as "
            f"'bash scripts/run_async.sh {cpu_recipe}', or cluster.device_type=auto."
        )
    components = parse_placement(
        dict(cfg.cluster.component_placement),
        num_devices=num_gpus if kind == "gpu" and cfg.cluster.num_nodes == 1 else None,
        device_kind=kind,
    )
    return Placement(components=components, device_kind=kind)
