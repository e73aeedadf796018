"""Turn a composed (Hydra/OmegaConf) config into a validated ``TrainConfig`` and its ``Topology``.

Everything here runs before any worker starts, so a bad config costs seconds, not a run. Each error
names the key path and how to fix it. The ``model`` and ``env`` sections are typed by the config
class of the family they name (``embodied_async.registry``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from typing import Any, Dict, Optional, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from embodied_async.config.batches import update_batches
from embodied_async.config.checks import ConfigError, bound, choice, positive, require
from embodied_async.config.family_hooks import hook
from embodied_async.config.mode_checks import check_mode
from embodied_async.config.mode_sections import OFFLINE_MODES
from embodied_async.config.schema import (
    GRAPH_CHANNELS,
    LOGPROB_TYPES,
    PRECISIONS,
    LoggerConfig,
    TrainConfig,
    schema_default,
)
from embodied_async.config.topology import Topology, resolve_topology

FAMILY_SECTIONS = ("model", "env")


def _family_classes(plain: Dict[str, Any]) -> Dict[str, type]:
    """The config class of the family each of ``model`` and ``env`` names."""
    from embodied_async.registry import family_config  # the registry imports this package

    classes = {}
    for section in FAMILY_SECTIONS:
        node = plain.get(section)
        name = node.get("name") if isinstance(node, dict) else None
        classes[section] = family_config(section, name)
    return classes


def _schema(classes: Dict[str, type]) -> DictConfig:
    schema = OmegaConf.structured(TrainConfig)
    return OmegaConf.merge(schema, {section: OmegaConf.structured(cls) for section, cls in classes.items()})


def _is_section(node: Any) -> bool:
    """A typed section (a dataclass) whose keys are checked; free-form dict fields are not walked."""
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) not in (dict, None)


def _reject_unknown_keys(node: Dict[str, Any], schema: DictConfig, path: str) -> None:
    valid = list(schema.keys())
    for key, value in node.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in valid:
            while isinstance(value, dict) and len(value) == 1:  # name the whole path given
                key, value = next(iter(value.items()))
                full = f"{full}.{key}"
            where = f" ({OmegaConf.get_type(schema).__qualname__})" if path else ""
            raise ConfigError(f"unknown config key '{full}'. Valid keys under '{path or '<top level>'}'{where}: "
                              f"{', '.join(valid)}. Fix the spelling or remove it.")
        child = schema._get_node(key)
        if _is_section(child) and isinstance(value, dict):
            _reject_unknown_keys(value, child, full)


def _take_renamed_keys(plain: Dict[str, Any], classes: Dict[str, type]) -> bool:
    """A family's renamed keys (``renamed_keys``: old -> new) still work until the next release: a
    value under the old name moves to the new one, with a warning naming it. True if any moved."""
    moved = False
    for section, cls in classes.items():
        node = plain.get(section)
        for old, new in getattr(cls, "renamed_keys", {}).items():
            if not isinstance(node, dict) or node.get(old) in (None, "???"):
                continue
            node[new], node[old], moved = node[old], None, True
            print(f"[config] warning: {section}.{old} is renamed {section}.{new}; the old name works until the next "
                  f"release: write {section}.{new}={node[new]}", file=sys.stderr, flush=True)
    return moved


def _merge(cfg: DictConfig, schema: DictConfig, classes: Dict[str, type]) -> TrainConfig:
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, cfg))
    except ConfigKeyError as err:  # what the walk above cannot see (e.g. keys added by interpolation)
        raise ConfigError(f"unknown config key '{err.full_key or err.key}'. Fix the spelling or remove it.") from None
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is required but not set: give it a value in the YAML or on the command "
                          f"line ({err.full_key}=...)") from None
    except ValidationError as err:
        section = str(err.full_key).split(".")[0]
        owner = classes.get(section, TrainConfig)
        raise ConfigError(
            f"bad value for config key '{err.full_key}': {err.msg.splitlines()[0]}. Give a value of the type "
            f"declared in {owner.__module__}.{owner.__qualname__}.") from None
    except OmegaConfBaseException as err:  # interpolation errors and the like
        raise ConfigError(f"config error at '{getattr(err, 'full_key', '?')}': {err}") from None


def resolve(cfg: Any, num_gpus: Optional[int] = None, evaluation: bool = False) -> Tuple[TrainConfig, Topology]:
    """Merge ``cfg`` (DictConfig or dict) into the schema; return the checked ``TrainConfig`` and the
    run's ``Topology`` (``num_gpus``: GPUs to assume instead of probing this machine; ``evaluation``:
    for a process that only evaluates, without the checks of how training batches split)."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    plain = OmegaConf.to_container(cfg, resolve=False)
    classes = _family_classes(plain)
    if _take_renamed_keys(plain, classes):
        cfg = OmegaConf.create(plain)
    schema = _schema(classes)
    _reject_unknown_keys(plain, schema, "")
    train_cfg = _merge(cfg, schema, classes)
    return train_cfg, check(train_cfg, num_gpus, evaluation)


def to_train_config(cfg: Any) -> TrainConfig:
    """``resolve(cfg)``'s config (the whole validation runs)."""
    return resolve(cfg)[0]


def to_eval_config(cfg: Any) -> TrainConfig:
    """The config of a process that only evaluates (the ``eval`` command): every check but those of
    how training batches split over the run's processes (its env is built at its own size)."""
    return resolve(cfg, evaluation=True)[0]


def check(cfg: TrainConfig, num_gpus: Optional[int] = None, evaluation: bool = False) -> Topology:
    """Semantic checks that the type system cannot express; returns the resolved topology
    (``evaluation``: without the checks of how training batches split).

    Cheap checks first: the families' own checks come last (one may import its simulator). A
    collection or an evaluation (``OFFLINE_MODES``) reads nothing of training: checked as an evaluation.
    """
    evaluation = evaluation or cfg.runner.mode in OFFLINE_MODES
    choice(cfg.cluster.backend, "cluster.backend", ("ray", "local"))
    choice(cfg.cluster.device_type, "cluster.device_type", ("auto", "cpu", "gpu"))
    choice(cfg.cluster.channel_transport, "cluster.channel_transport", ("auto", "ray"))
    for name, seconds in cfg.cluster.inject_channel_latency_s.items():
        choice(name, "a channel of cluster.inject_channel_latency_s", GRAPH_CHANNELS)
        bound(seconds, f"cluster.inject_channel_latency_s.{name}", lambda v: 0 <= v <= 60, "must be between 0 and 60",
              "give a link's latency in seconds")
    choice(cfg.model.precision, "model.precision", PRECISIONS)
    _check_counts(cfg)  # before the topology, which divides by these
    if num_gpus is None and cfg.runner.dry_run and cfg.cluster.device_type == "gpu":
        from embodied_async.plan import planned_num_gpus

        try:  # a dry run plans for the machine the placement names, not this one
            num_gpus = planned_num_gpus(cfg)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    topology = resolve_topology(cfg, num_gpus)
    if not evaluation:
        _check_batches(cfg, topology.actor_world_size)
    _check_algorithm(cfg)
    _check_actor_and_runner(cfg)
    if cfg.runner.resume_dir is not None:
        _check_resume_dir(cfg.runner.resume_dir, "runner.resume_dir")
    if cfg.model.init_from is not None:
        _check_resume_dir(cfg.model.init_from, "model.init_from")
    check_mode(cfg)
    if cfg.runner.mode not in OFFLINE_MODES:
        _check_advantages(cfg, topology)
    if not evaluation:
        _check_demonstrations(cfg, topology.actor_world_size)
    _check_tasks(cfg, None if evaluation else topology)
    _check_slow_workers(cfg.env, topology.num_env_workers)
    _check_python_env(cfg)
    if not evaluation:  # a process that only evaluates logs to no tracker
        _check_logger(cfg)
    for section in FAMILY_SECTIONS:
        family_cfg = getattr(cfg, section)
        # each task of env.tasks checked on its own; without them, the one config
        configs = family_cfg.task_configs(max(1, len(family_cfg.tasks))) if section == "env" else [family_cfg]
        for each in configs:
            try:
                each.check()
            except ConfigError:
                raise
            except ValueError as err:
                raise ConfigError(f"{section} ({family_cfg.name}): {err}") from None
    return topology


def _check_advantages(cfg: TrainConfig, topology: Topology) -> None:
    """``algorithm.adv_type``: GAE needs a critic; grpo builds none, and needs whole groups in every
    policy batch (and actor shard) and every episode to end within its trajectory. Resolves
    ``model.add_value_head`` (null: as the algorithm needs)."""
    alg, model = cfg.algorithm, cfg.model
    choice(alg.adv_type, "algorithm.adv_type", ("gae", "grpo"))
    value_free = alg.adv_type == "grpo"
    if model.add_value_head is None:
        model.add_value_head = not value_free
    require(model.add_value_head != value_free,
            f"model.add_value_head={model.add_value_head} with algorithm.adv_type={alg.adv_type}: "
            + ("a group-relative (value-free) run builds no critic: set model.add_value_head=false or null"
               if value_free else "GAE needs the critic's values: set model.add_value_head=true or null"))
    value_input = getattr(model, "value_input", None)
    require(value_input != "privileged_states" or cfg.env.privileged_states or value_free,
            "model.value_input=privileged_states: the critic reads the env's privileged state vector; set "
            "env.privileged_states=true")
    choice(alg.group_episode_weight, "algorithm.group_episode_weight", ("step", "episode"))
    if not value_free:
        return
    size = alg.group_size
    bound(size, "algorithm.group_size", lambda v: v >= 2, "must be >= 2 with algorithm.adv_type=grpo",
          "each initial state is tried by a group of sub-envs whose returns are compared: use e.g. 4 or 8")
    require(cfg.actor.critic_warmup_steps == 0,
            f"actor.critic_warmup_steps={cfg.actor.critic_warmup_steps} with algorithm.adv_type=grpo: a value-free "
            "run has no critic to warm up; set it to 0")
    shard = topology.envs_per_stage // topology.actor_world_size
    require(topology.envs_per_stage % topology.actor_world_size == 0 and shard % size == 0,
            f"algorithm.group_size={size}: every policy batch ({topology.envs_per_stage} sub-envs: env.num_envs over "
            f"the env processes and their stages) must hold whole groups, on each of the {topology.actor_world_size} "
            f"actor ranks; make env.num_envs a multiple of "
            f"{size * topology.actor_world_size * topology.num_env_workers * topology.stages}")
    episode = getattr(cfg.env, "max_episode_steps", None)
    covered = cfg.rollout.num_steps * cfg.env.num_action_chunks
    require(not isinstance(episode, int) or covered >= episode,
            f"algorithm.adv_type=grpo needs every episode to end within its trajectory: rollout.num_steps x "
            f"env.num_action_chunks = {cfg.rollout.num_steps} x {cfg.env.num_action_chunks} = {covered} env steps, "
            f"less than env.max_episode_steps={episode}; set rollout.num_steps to at least "
            f"{-(-episode // cfg.env.num_action_chunks)}")
    require(not alg.normalize_advantages or cfg.runner.mode != "ppo",
            "algorithm.normalize_advantages=true (its default) with algorithm.adv_type=grpo: group-relative "
            "advantages are already over each group's std, and normalising them again over the batch (weighted by "
            "steps) breaks each group's zero mean: set algorithm.normalize_advantages=false")


def _check_demonstrations(cfg: TrainConfig, world: int) -> None:
    alg = cfg.algorithm
    bound(alg.anchor_kl_coef, "algorithm.anchor_kl_coef", lambda v: v >= 0, "must be >= 0",
          "use 0 (no anchor) or e.g. 0.01")
    bound(alg.demo_loss_coef, "algorithm.demo_loss_coef", lambda v: v >= 0, "must be >= 0",
          "use 0 for no demonstrations in the RL loss, or e.g. 0.1")
    if alg.demo_loss_coef == 0:
        return
    require(cfg.runner.mode == "ppo", "algorithm.demo_loss_coef is a term of the PPO loss: set it to 0 for "
                                      "runner.mode=sft")
    require(cfg.dataset.root is not None,
            f"algorithm.demo_loss_coef={alg.demo_loss_coef} needs demonstrations: set dataset.root to a LeRobot "
            "dataset (e.g. the SFT run's)")
    positive(alg.demo_batch_size, "algorithm.demo_batch_size")
    require(alg.demo_batch_size % world == 0,
            f"algorithm.demo_batch_size={alg.demo_batch_size} must split evenly over the {world} actor ranks; use a "
            f"multiple of {world}")


def _check_tasks(cfg: TrainConfig, topology: Optional[Topology]) -> None:
    """``env.tasks``: a family that names its tasks, each task once, every policy batch and the
    evaluation holding each task alike (``topology`` None: a process that only evaluates)."""
    tasks = list(cfg.env.tasks)
    if not tasks:
        return
    require(type(cfg.env).task_key is not None,
            f"env.tasks={tasks}: the '{cfg.env.name}' env family runs one task per run; remove env.tasks")
    require(len(set(tasks)) == len(tasks), f"env.tasks={tasks} names a task twice; list each task once")
    if topology is None:
        return
    batch = topology.envs_per_stage
    require(batch % len(tasks) == 0,
            f"env.tasks: the {len(tasks)} tasks must spread evenly over each policy batch ({batch} sub-envs: "
            f"env.num_envs over the env processes and their stages); make env.num_envs a multiple of "
            f"{len(tasks) * topology.num_env_workers * topology.stages}")
    require(cfg.runner.eval_num_envs % len(tasks) == 0,
            f"runner.eval_num_envs={cfg.runner.eval_num_envs} must be a multiple of the {len(tasks)} env.tasks, "
            "so the evaluation scores every task alike")


def _check_slow_workers(env, num_env_workers: int) -> None:
    bound(env.slow_worker_delay_s, "env.slow_worker_delay_s", lambda v: v >= 0, "must be >= 0",
          "it is the seconds each step of the env workers in env.slow_workers takes longer")
    bad = [rank for rank in env.slow_workers if not 0 <= rank < num_env_workers]
    require(not bad, f"env.slow_workers={list(env.slow_workers)}: no env worker {bad[0] if bad else ''} "
            f"(this placement has {num_env_workers}: ranks 0-{num_env_workers - 1})")
    require(bool(env.slow_workers) == (env.slow_worker_delay_s > 0),
            f"env.slow_workers={list(env.slow_workers)} with env.slow_worker_delay_s={env.slow_worker_delay_s}: "
            "set both (the ranks to slow down and the seconds per step) or neither")


def _check_logger(cfg: TrainConfig) -> None:
    """``runner.logger``: not the former switch, known trackers, each installed (found without
    importing it: the config layer stays light), a project name both wandb and swanlab accept."""
    logger, known = cfg.runner.logger, LoggerConfig.known_backends
    require(logger.tensorboard is None,
            f"runner.logger.tensorboard is replaced by runner.logger.backends, a list of {', '.join(known)} ([]: "
            f"metrics.jsonl only): write runner.logger.backends={'[tensorboard]' if logger.tensorboard else '[]'}")
    for name in logger.backends:
        require(name in known, f"runner.logger.backends={list(logger.backends)}: unknown tracker {name!r}; use any "
                               f"of: {', '.join(known)} (or [] for metrics.jsonl only)")
        require(importlib.util.find_spec(name) is not None,
                f"runner.logger.backends names {name}, but the {name} package is not installed: run "
                f".venv/bin/pip install {name} (or remove it from runner.logger.backends)")
    require(len(set(logger.backends)) == len(logger.backends),
            f"runner.logger.backends={list(logger.backends)} names a tracker twice; list each once")
    require(re.fullmatch(r"[0-9A-Za-z_\-+.]{1,100}", logger.project) is not None,
            f"runner.logger.project={logger.project!r}: use 1-100 letters, digits and _ - + . (what both wandb "
            "and swanlab accept), e.g. embodied_async")


def _check_python_env(cfg: TrainConfig) -> None:
    """A family with a Python environment of its own needs it built (one line naming the command)."""
    name = type(cfg.env).python_env
    if name is None:
        return
    from embodied_async.isolated.child import family_interpreter

    try:
        family_interpreter(name)
    except FileNotFoundError as err:
        raise ConfigError(f"env ({cfg.env.name}): {err}") from None


def _check_counts(cfg: TrainConfig) -> None:
    for key in ("cluster.num_nodes", "cluster.cpu_threads_per_worker", "env.num_envs", "rollout.num_steps",
                "actor.global_batch_size", "actor.micro_batch_size", "env.pipeline_stage_num",
                "env.num_action_chunks", "algorithm.update_epochs", "algorithm.rollout_store_size_per_rank",
                "runner.max_steps", "runner.eval_episodes", "runner.eval_num_envs"):
        section, name = key.split(".")
        positive(getattr(getattr(cfg, section), name), key)
    bound(cfg.env.max_abs_value, "env.max_abs_value", lambda v: v > 0, "must be > 0",
          "observations and rewards beyond it count as NaNs (env.on_nonfinite): use e.g. 1e6")
    choice(cfg.env.on_nonfinite, "env.on_nonfinite", ("stop", "drop"))
    require(cfg.env.end_on_success or type(cfg.env).can_run_past_success,
            f"env.end_on_success=false, but the '{cfg.env.name}' env family's tasks end an episode at success: "
            "remove it")
    require(cfg.env.end_on_success or not cfg.env.terminal_on_success,
            "env.terminal_on_success=true with env.end_on_success=false: no episode ends at success, so there is "
            "no such end to treat as terminal; remove one of them")
    require(not cfg.env.privileged_states or hook(cfg.env, "supports_privileged_states"),
            f"env.privileged_states=true, but the '{cfg.env.name}' env family cannot give them: set it to false")


def _check_staleness_control(alg) -> None:
    choice(alg.staleness_control, "algorithm.staleness_control", ("fixed", "kl"))
    if alg.staleness_control != "kl":
        for key in ("staleness_min", "staleness_max", "staleness_kl_low", "staleness_kl_high", "staleness_kl_patience"):
            require(getattr(alg, key) == schema_default(f"algorithm.{key}"),
                    f"algorithm.{key}={getattr(alg, key)} does nothing under algorithm.staleness_control="
                    f"{alg.staleness_control}: set algorithm.staleness_control=kl for a bound that follows the "
                    "behaviour KL, or leave it out")
        return
    bound(alg.staleness_min, "algorithm.staleness_min", lambda v: v >= 0, "must be >= 0",
          "it is the lowest bound the KL control may set: 0 allows synchronous updates")
    bound(alg.staleness_max, "algorithm.staleness_max", lambda v: v >= alg.staleness_min,
          f"must be >= algorithm.staleness_min ({alg.staleness_min})",
          "it is the highest bound the KL control may set (the trajectory queues are sized for it)")
    bound(alg.staleness_kl_low, "algorithm.staleness_kl_low", lambda v: v >= 0, "must be >= 0",
          "the bound rises while the behaviour KL stays under it: e.g. 0.01")
    bound(alg.staleness_kl_high, "algorithm.staleness_kl_high", lambda v: v > alg.staleness_kl_low,
          f"must be > algorithm.staleness_kl_low ({alg.staleness_kl_low}): the band between them holds the bound",
          "e.g. 0.03")
    bound(alg.staleness_kl_patience, "algorithm.staleness_kl_patience", lambda v: v >= 1, "must be >= 1",
          "it is how many updates in a row must read outside the band before the bound moves")


def _check_algorithm(cfg: TrainConfig) -> None:
    alg = cfg.algorithm
    bound(alg.staleness_threshold, "algorithm.staleness_threshold", lambda v: v >= 0, "must be >= 0",
          "use 0 for synchronous PPO or N to train on data up to N versions old")
    _check_staleness_control(alg)
    choice(alg.batch_from, "algorithm.batch_from", ("every_stream", "first_arrived"))
    bound(alg.on_policy_min_ratio, "algorithm.on_policy_min_ratio", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
          "it is the fraction of an update's trajectories made by the current version: use 0 to accept "
          "any version-valid mix, 1 for all fresh")
    bound(alg.gamma, "algorithm.gamma", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]",
          "it is the discount factor: use e.g. 0.8-0.99")
    bound(alg.gae_lambda, "algorithm.gae_lambda", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
          "use e.g. 0.9-0.95 (0: one-step TD, 1: Monte Carlo)")
    for name in ("clip_ratio_low", "clip_ratio_high"):
        bound(getattr(alg, name), f"algorithm.{name}", lambda v: v > 0, "must be > 0",
              "use e.g. 0.2 (the PPO ratio is clipped to 1 -/+ it)")
    bound(alg.clip_ratio_low, "algorithm.clip_ratio_low", lambda v: v < 1, "must be < 1",
          "the lower clip 1 - clip_ratio_low must stay positive: use e.g. 0.2")
    bound(alg.clip_ratio_c, "algorithm.clip_ratio_c", lambda v: v > 1.0, "(dual clip) must be > 1", "use e.g. 3.0")
    choice(alg.logprob_type, "algorithm.logprob_type", LOGPROB_TYPES)
    supported = type(cfg.model).logprob_types
    require(alg.logprob_type in supported,
            f"algorithm.logprob_type={alg.logprob_type}: the '{cfg.model.name}' policy family reports "
            f"{' or '.join(supported)} log-probs only; use algorithm.logprob_type=chunk_level")
    bound(alg.behave_weight_threshold, "algorithm.behave_weight_threshold", lambda v: v > 1.0, "must be > 1",
          "samples whose proximal/behaviour weight exceeds it are masked, and a fresh sample's weight is 1, "
          "so <= 1 masks (nearly) every sample: use e.g. 2.0", null="to disable it")
    bound(alg.target_kl, "algorithm.target_kl", lambda v: v > 0, "must be > 0",
          "the epoch loop stops once the proximal KL exceeds it: use e.g. 0.1", null="to disable it")
    bound(alg.value_clip, "algorithm.value_clip", lambda v: v > 0, "must be > 0",
          "it bounds the value update around the rollout-time value: use e.g. 0.2", null="to disable it")
    bound(alg.huber_delta, "algorithm.huber_delta", lambda v: v > 0, "must be > 0", "use e.g. 10.0")
    for name in ("value_loss_coef", "entropy_coef"):
        bound(getattr(alg, name), f"algorithm.{name}", lambda v: v >= 0, "must be >= 0", "use 0 to turn the term off")


def _check_actor_and_runner(cfg: TrainConfig) -> None:
    actor, runner = cfg.actor, cfg.runner
    bound(actor.lr, "actor.lr", lambda v: v > 0, "must be > 0", "use e.g. 3e-4")
    bound(actor.value_lr, "actor.value_lr", lambda v: v > 0, "must be > 0", "use e.g. 3e-3", null="to use actor.lr")
    bound(actor.adam_eps, "actor.adam_eps", lambda v: v > 0, "must be > 0", "use e.g. 1e-5")
    choice(actor.optimizer, "actor.optimizer", ("adam", "adamw"))
    require(len(actor.betas) == 2 and all(0.0 <= b < 1.0 for b in actor.betas),
            f"actor.betas={list(actor.betas)} must be two numbers in [0, 1); use e.g. [0.9, 0.999]")
    bound(actor.weight_decay, "actor.weight_decay", lambda v: v >= 0, "must be >= 0", "use 0 for none")
    bound(actor.critic_warmup_steps, "actor.critic_warmup_steps", lambda v: v >= 0, "must be >= 0",
          "use 0 for no warm-up")
    choice(actor.policy_lr_schedule, "actor.policy_lr_schedule", ("constant", "cosine"))
    bound(actor.policy_min_lr_ratio, "actor.policy_min_lr_ratio", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
          "it is the policy's final learning rate as a fraction of actor.lr: use e.g. 0.1")
    bound(actor.policy_lr_warmup_steps, "actor.policy_lr_warmup_steps", lambda v: v >= 0, "must be >= 0",
          "use 0 for the full learning rate from the first policy step")
    bound(actor.max_grad_norm, "actor.max_grad_norm", lambda v: v > 0, "must be > 0",
          "it clips the gradient norm: use e.g. 0.5 (or a large value to clip rarely)")
    for name in ("val_check_interval", "save_interval"):
        bound(getattr(runner, name), f"runner.{name}", lambda v: v >= 0, "must be >= 0",
              "use 0 to turn it off, or N for every N steps")
    bound(runner.keep_checkpoints, "runner.keep_checkpoints", lambda v: v >= 1, "must be >= 1",
          "keep at least the newest checkpoint", null="to keep every checkpoint")
    bound(runner.preemption_grace_s, "runner.preemption_grace_s", lambda v: v > 0, "must be > 0",
          "set it a few seconds below the scheduler's grace period (SLURM's KillWait, 30 s by default)")
    bound(runner.restarts_per_hour, "runner.restarts_per_hour", lambda v: v >= 0, "must be >= 0",
          "use 0 to stop at the first fault, or N to restart from the last checkpoint up to N times an hour")
    bound(runner.hang_timeout_s, "runner.hang_timeout_s", lambda v: v == 0 or v >= 5, "must be 0 or >= 5",
          "use 0 to never treat a busy worker as hung, or the longest a simulator step or an inference may take")
    bound(runner.update_hang_factor, "runner.update_hang_factor", lambda v: v == 0 or v >= 2, "must be 0 or >= 2",
          "use 0 to never treat a long update as hung, or how many times its longest update an update may take")
    bound(runner.node_wait_s, "runner.node_wait_s", lambda v: v >= 0, "must be >= 0",
          "use 0 to stop at once when a node is lost, or how long a replacement node may take to join")
    bound(runner.max_env_steps, "runner.max_env_steps", lambda v: v >= 1, "must be positive", "set an env-step budget",
          null="to stop at runner.max_steps only")
    bound(runner.stop_at_eval_success, "runner.stop_at_eval_success", lambda v: 0.0 < v <= 1.0,
          "must be a success rate in (0, 1]", "use e.g. 0.9", null="to train to runner.max_steps")
    require(runner.stop_at_eval_success is None or runner.val_check_interval > 0,
            f"runner.stop_at_eval_success={runner.stop_at_eval_success} needs evaluations: set "
            "runner.val_check_interval to N > 0 (evaluate every N steps)")
    require(not runner.eval_stop_once_below_target or runner.stop_at_eval_success is not None,
            "runner.eval_stop_once_below_target=true needs a target: set runner.stop_at_eval_success (e.g. 0.9)")


def _check_batches(cfg: TrainConfig, world: int) -> None:
    """Trajectories and minibatches divide evenly over the actor ranks."""
    store = cfg.algorithm.rollout_store_size_per_rank
    actor, batches = cfg.actor, update_batches(cfg, world)
    # a supervised run's batches come from its dataset, not from rollouts
    require(cfg.runner.mode == "sft" or batches.decisions % batches.minibatch == 0,
            f"one update's batch (algorithm.rollout_store_size_per_rank x env.num_envs x rollout.num_steps = "
            f"{store} x {cfg.env.num_envs} x {cfg.rollout.num_steps} = {batches.decisions} decisions) must be a "
            f"multiple of actor.global_batch_size={actor.global_batch_size}; pick a divisor of {batches.decisions} "
            "for actor.global_batch_size or change the factors")
    require(batches.minibatch % world == 0,
            f"actor.global_batch_size={actor.global_batch_size} must split evenly over the {world} actor "
            f"ranks; use a multiple of {world}")
    require(batches.per_rank % batches.micro == 0,
            f"each actor rank's share of actor.global_batch_size ({batches.per_rank}) must be a multiple of "
            f"actor.micro_batch_size={actor.micro_batch_size}; use a divisor of {batches.per_rank}")
    require(cfg.runner.eval_episodes % cfg.runner.eval_num_envs == 0,
            f"runner.eval_episodes={cfg.runner.eval_episodes} must be a multiple of "
            f"runner.eval_num_envs={cfg.runner.eval_num_envs}; round it to a multiple")
    _check_video(cfg)


def _check_video(cfg: TrainConfig) -> None:
    size = list(cfg.env.video_size)
    require(len(size) == 2 and all(int(v) > 0 for v in size),
            f"env.video_size={size} must be [height, width] with two positive integers; use e.g. [256, 256]")
    if not cfg.runner.eval_video:
        return
    cfg.env.check_video()
    positive(cfg.runner.eval_video_episodes, "runner.eval_video_episodes")
    positive(cfg.runner.eval_video_fps, "runner.eval_video_fps")


def _check_resume_dir(path: str, key: str) -> None:
    from embodied_async.run_folder import not_a_checkpoint

    problem = not_a_checkpoint(path, key)
    require(problem is None, problem)
