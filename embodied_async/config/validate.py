"""Turn a composed (Hydra/OmegaConf) config into a validated ``TrainConfig``.

Everything here runs before any worker starts, so a bad config costs seconds, not a run. Each error
names the key path and how to fix it.
"""

from __future__ import annotations

import dataclasses
import os
import re
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


def _value(cfg: TrainConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _bound(cfg: TrainConfig, key: str, ok, rule: str, fix: str, null: Optional[str] = None) -> None:
    """``key`` must satisfy ``ok(value)`` (``rule`` says how in words); ``fix`` says what to set.

    ``null``: None is allowed and means this (e.g. "to disable it"); it is not passed to ``ok``.
    """
    value = _value(cfg, key)
    if null is not None and value is None:
        return
    _require(ok(value), f"{key}={value!r} {rule}; {fix}" + (f" (or null {null})" if null else ""))


# ``owner/name`` on the Hugging Face hub (one slash, no path-like start)
_HUB_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_LOCAL_PREFIXES = ("/", "./", "../", "~")


def _check_model_path(cfg: TrainConfig) -> None:
    """``model.path`` is a local folder or a hub repo id ``owner/name`` (looked up by the worker).

    A path that looks local must exist, unless ``model.tiny_random_init`` will create it there.
    """
    path = cfg.model.path
    if path is None or cfg.model.tiny_random_init:
        return
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return
    if os.path.exists(local):
        raise ConfigError(f"model.path={path!r} is a file, not a checkpoint folder: point model.path at the "
                          "folder that holds config.json and the weights")
    if path.startswith(_LOCAL_PREFIXES) or path in (".", "..") or not _HUB_REPO_ID.fullmatch(path):
        raise ConfigError(
            f"model.path={path!r} is neither an existing folder nor a Hugging Face repo id ('owner/name'): "
            "fix the path (relative paths are relative to the working directory), give a repo id such as "
            "'openvla/openvla-7b', or set model.tiny_random_init=true to create a tiny random checkpoint there"
        )


def _check_resume_dir(path: str) -> None:
    example = "logs/<run>/checkpoints/global_step_<N>"
    _require(os.path.isdir(path), f"runner.resume_dir={path!r} is not a folder; point it at a checkpoint "
                                  f"folder such as {example}")
    if os.path.isfile(os.path.join(path, "runner.json")):
        return
    hint = ""
    latest = os.path.join(path, "latest")  # the checkpoints root names its newest checkpoint
    if os.path.isfile(latest):
        with open(latest) as f:
            hint = f" (this looks like a checkpoints root: its newest is {os.path.join(path, f.read().strip())!r})"
    raise ConfigError(f"runner.resume_dir={path!r} is a folder but not a checkpoint (it holds no runner.json)"
                      f"{hint}; point it at one checkpoint folder such as {example}")


def _check_placement(cfg: TrainConfig, placement) -> None:
    """What ``parse_placement`` cannot know: how the backend runs the placed processes.

    Components may share ids: with cluster.backend=ray, components co-located on a GPU take turns
    on it, and CPU ids are only process slots, so any overlap is fine there. With
    cluster.backend=local the whole graph runs in this one process: it holds a single actor rank
    and sees a single GPU.
    """
    if cfg.cluster.backend != "local":
        return
    actor_ids = placement.ids("actor")
    _require(len(actor_ids) == 1,
             f"cluster.component_placement places actor on {len(actor_ids)} ids {actor_ids}, but "
             "cluster.backend=local runs one actor rank in this process: place actor on a single id "
             "(e.g. 'actor': '0'), or use cluster.backend=ray for several ranks")
    if placement.device_kind == "gpu":
        all_ids = sorted({i for c in ("env", "rollout", "actor") for i in placement.ids(c)})
        _require(len(all_ids) == 1,
                 f"cluster.component_placement uses GPUs {all_ids}, but cluster.backend=local runs in one "
                 "process, which sees one GPU: place every component on the same GPU id "
                 "(e.g. {'env,rollout,actor': '0'}), or use cluster.backend=ray")


def _check_env_family(cfg: TrainConfig) -> None:
    """The env family's own start-up check (e.g. ManiSkill's task ids), found through the registry."""
    from embodied_async.registry import env_config_check

    family_check = env_config_check(cfg.env.name)
    if family_check is None:
        return
    try:
        family_check(cfg.env)
    except ValueError as err:
        message = str(err)
        if "env.task_id" not in message:
            message = f"env.task_id={cfg.env.task_id!r}: {message}"
        raise ConfigError(f"{message}. Set env.task_id to a task that env.name={cfg.env.name} registers "
                          "(check the spelling and the -v<N> version suffix)") from None


def check(cfg: TrainConfig, num_gpus: Optional[int] = None) -> None:
    """Semantic checks that the type system cannot express."""
    from embodied_async.scheduler.placement import PlacementError

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
    _check_ranges(cfg)
    _check_model_path(cfg)
    _check_placement(cfg, placement)
    _check_batches(cfg, placement)
    if cfg.runner.resume_dir is not None:
        _check_resume_dir(cfg.runner.resume_dir)
    # last: the family check may import its simulator (seconds), so cheap mistakes are reported first
    _check_env_family(cfg)


def _check_ranges(cfg: TrainConfig) -> None:
    """Each number within its meaningful range, and no pretrained-model keys on small policies."""
    for key in ("cluster.num_nodes", "cluster.cpu_threads_per_worker", "env.num_envs", "rollout.num_steps",
                "actor.global_batch_size", "actor.micro_batch_size", "env.pipeline_stage_num",
                "env.num_action_chunks", "algorithm.update_epochs", "algorithm.rollout_store_size_per_rank",
                "runner.max_steps", "runner.eval_episodes", "runner.eval_num_envs"):
        _bound(cfg, key, lambda v: v >= 1, "must be a positive integer", "set it to 1 or more")
    _bound(cfg, "algorithm.staleness_threshold", lambda v: v >= 0, "must be >= 0",
           "use 0 for synchronous PPO or N to train on data up to N versions old")
    _bound(cfg, "algorithm.on_policy_min_ratio", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
           "it is the fraction of an update's trajectories made by the current version: use 0 to accept "
           "any version-valid mix, 1 for all fresh")
    _bound(cfg, "algorithm.gamma", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]",
           "it is the discount factor: use e.g. 0.8-0.99")
    _bound(cfg, "algorithm.gae_lambda", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
           "use e.g. 0.9-0.95 (0: one-step TD, 1: Monte Carlo)")
    for key in ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high"):
        _bound(cfg, key, lambda v: v > 0, "must be > 0", "use e.g. 0.2 (the PPO ratio is clipped to 1 -/+ it)")
    _bound(cfg, "algorithm.clip_ratio_low", lambda v: v < 1, "must be < 1",
           "the lower clip 1 - clip_ratio_low must stay positive: use e.g. 0.2")
    _bound(cfg, "algorithm.clip_ratio_c", lambda v: v > 1.0, "(dual clip) must be > 1", "use e.g. 3.0")
    _bound(cfg, "algorithm.behave_weight_threshold", lambda v: v > 1.0, "must be > 1",
           "samples whose proximal/behaviour weight exceeds it are masked, and a fresh sample's weight is 1, "
           "so <= 1 masks (nearly) every sample: use e.g. 2.0", null="to disable it")
    _bound(cfg, "algorithm.target_kl", lambda v: v > 0, "must be > 0",
           "the epoch loop stops once the proximal KL exceeds it: use e.g. 0.1", null="to disable it")
    _bound(cfg, "algorithm.value_clip", lambda v: v > 0, "must be > 0",
           "it bounds the value update around the rollout-time value: use e.g. 0.2", null="to disable it")
    _bound(cfg, "algorithm.huber_delta", lambda v: v > 0, "must be > 0", "use e.g. 10.0")
    for key in ("algorithm.value_loss_coef", "algorithm.entropy_coef"):
        _bound(cfg, key, lambda v: v >= 0, "must be >= 0", "use 0 to turn the term off")
    _bound(cfg, "actor.lr", lambda v: v > 0, "must be > 0", "use e.g. 3e-4")
    _bound(cfg, "actor.value_lr", lambda v: v > 0, "must be > 0", "use e.g. 3e-3", null="to use actor.lr")
    _bound(cfg, "actor.adam_eps", lambda v: v > 0, "must be > 0", "use e.g. 1e-5")
    _bound(cfg, "actor.weight_decay", lambda v: v >= 0, "must be >= 0", "use 0 for none")
    _bound(cfg, "actor.critic_warmup_steps", lambda v: v >= 0, "must be >= 0", "use 0 for no warm-up")
    _bound(cfg, "actor.max_grad_norm", lambda v: v > 0, "must be > 0",
           "it clips the gradient norm: use e.g. 0.5 (or a large value to clip rarely)")
    _bound(cfg, "env.max_abs_value", lambda v: v > 0, "must be > 0",
           "observations and rewards beyond it are dropped like NaNs: use e.g. 1e6")
    _bound(cfg, "env.max_episode_steps", lambda v: v >= 0, "must be >= 0", "use 0 for the task's own limit")
    image_size = list(cfg.env.image_size)
    _require(len(image_size) == 2 and all(v > 0 for v in image_size),
             f"env.image_size={image_size} must be [height, width] with two positive integers; "
             "use e.g. [128, 128]")
    _bound(cfg, "model.temperature", lambda v: v > 0, "must be > 0", "use 1.0 to sample from the policy as is")
    _bound(cfg, "model.top_k", lambda v: v >= 1, "must be >= 1", "use e.g. 50", null="to sample from all action tokens")
    for key in ("runner.val_check_interval", "runner.save_interval"):
        _bound(cfg, key, lambda v: v >= 0, "must be >= 0", "use 0 to turn it off, or N for every N steps")
    _bound(cfg, "runner.max_env_steps", lambda v: v >= 1, "must be positive", "set an env-step budget",
           null="to stop at runner.max_steps only")
    if cfg.model.lora.enabled:
        _bound(cfg, "model.lora.rank", lambda v: v >= 1, "must be >= 1", "use e.g. 32")
        _bound(cfg, "model.lora.dropout", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)", "use e.g. 0.0")
    if cfg.model.name in ("mlp", "cnn"):
        unused = [key for key, value in (("model.lora.enabled", cfg.model.lora.enabled),
                                         ("model.gradient_checkpointing", cfg.model.gradient_checkpointing),
                                         ("model.path", cfg.model.path),
                                         ("model.tiny_random_init", cfg.model.tiny_random_init)) if value]
        _require(not unused, f"{', '.join(unused)} apply to pretrained models; model.name={cfg.model.name} "
                             "does not use them: remove the override")


def _check_batches(cfg: TrainConfig, placement) -> None:
    """Sub-envs, trajectories and minibatches divide evenly over the placed processes."""
    num_env_procs = len(placement.ids("env"))
    num_rollout_procs = len(placement.ids("rollout"))
    world = len(placement.ids("actor"))
    stages = cfg.env.pipeline_stage_num
    _require(cfg.env.num_envs % (num_env_procs * stages) == 0,
             f"env.num_envs={cfg.env.num_envs} must divide evenly over {num_env_procs} env processes x "
             f"{stages} pipeline stages (env.pipeline_stage_num); use a multiple of {num_env_procs * stages}")
    _require(num_env_procs % num_rollout_procs == 0,
             f"the {num_env_procs} env processes must split evenly over the {num_rollout_procs} rollout "
             "processes (cluster.component_placement); place a multiple of the rollout count on env")
    envs_per_rollout_stage = cfg.env.num_envs // num_rollout_procs // stages
    _require(envs_per_rollout_stage % world == 0,
             f"each rollout stage batch ({envs_per_rollout_stage} sub-envs) must split evenly over the "
             f"{world} actor ranks; make env.num_envs a multiple of {num_rollout_procs * stages * world}")
    store = cfg.algorithm.rollout_store_size_per_rank
    batch = store * cfg.env.num_envs * cfg.rollout.num_steps
    _require(batch % cfg.actor.global_batch_size == 0,
             f"one update's batch (algorithm.rollout_store_size_per_rank x env.num_envs x rollout.num_steps = "
             f"{store} x {cfg.env.num_envs} x {cfg.rollout.num_steps} = {batch} decisions) must be a multiple "
             f"of actor.global_batch_size={cfg.actor.global_batch_size}; pick a divisor of {batch} for "
             "actor.global_batch_size or change the factors")
    _require(cfg.actor.global_batch_size % world == 0,
             f"actor.global_batch_size={cfg.actor.global_batch_size} must split evenly over the {world} actor "
             f"ranks; use a multiple of {world}")
    per_rank = cfg.actor.global_batch_size // world
    micro = min(cfg.actor.micro_batch_size, per_rank)
    _require(per_rank % micro == 0,
             f"each actor rank's share of actor.global_batch_size ({per_rank}) must be a multiple of "
             f"actor.micro_batch_size={cfg.actor.micro_batch_size}; use a divisor of {per_rank}")
    _require(cfg.runner.eval_episodes % cfg.runner.eval_num_envs == 0,
             f"runner.eval_episodes={cfg.runner.eval_episodes} must be a multiple of "
             f"runner.eval_num_envs={cfg.runner.eval_num_envs}; round it to a multiple")


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
