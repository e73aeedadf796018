"""What ``runner.mode: collect`` records: episodes of a source acting in the env, one frame per
executed action with the observation it was taken at, for a LeRobot dataset (format v3.0).

A source is the env family's scripted expert (``collect.source: scripted``, the family's
``scripted_expert``, ``config/family_hooks.py``) or a checkpoint of one of our runs acting deterministically
(``teacher:<folder>``; a teacher trained on state observations sees the env's privileged states
while the dataset records what the env renders). Everything here is checked before a worker
starts (``check_plan``); the dataset writer's own checks follow once an env is built
(``open_writer``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, List, Optional

import numpy as np

from embodied_async.config.checks import ConfigError
from embodied_async.config.family_hooks import hook
from embodied_async.datasets import lerobot_format as fmt
from embodied_async.datasets.batches import CONVENTIONAL_KEYS

# dataset key of each observation the dataset records, and of the actions (LeRobot's names)
RECORDED = {name: key for name, key in CONVENTIONAL_KEYS.items() if name != "actions"}
ACTION_KEY = CONVENTIONAL_KEYS["actions"]
# env keys of no concern to the episodes: a dataset may be appended to with other values of these
NOT_COLLECTION = ("num_envs", "pipeline_stage_num", "render_video", "video_size", "privileged_states")
TEACHER_PREFIX = "teacher:"


@dataclasses.dataclass
class Teacher:
    """A run's checkpoint acting as the source (all a worker process needs to rebuild it)."""

    model_cfg: object
    checkpoint: str
    privileged: bool  # trained on state observations: it sees the env's privileged_states


@dataclasses.dataclass
class Plan:
    """What the collection's workers build: the env config they act in (one sub-env each) and the
    teacher (None: the scripted expert); ``collection_env`` is the env config as the dataset's
    ``meta/collection.json`` holds it, compared when a dataset is appended to."""

    env_cfg: object
    teacher: Optional[Teacher]
    collection_env: Dict[str, object]


def check_plan(cfg) -> Plan:
    """The collection ``cfg`` (a TrainConfig in ``runner.mode: collect``) asks for, checked against
    its env, its source and the dataset it appends to; ConfigError naming the problem and the fix."""
    env_cfg, source = cfg.env, cfg.collect.source
    if int(env_cfg.num_action_chunks) != 1:
        raise ConfigError(f"env.num_action_chunks={env_cfg.num_action_chunks}: the envs return one observation per "
                          "chunk, and a dataset needs the observation of every executed action; set "
                          "env.num_action_chunks=1 (a policy trained on it may still predict chunks)")
    teacher = None
    if source == "scripted":
        if hook(env_cfg, "scripted_expert") is None:
            raise ConfigError(f"the '{env_cfg.name}' env family has no scripted expert (env.scripted_expert): use "
                              "--source teacher:<checkpoint folder>")
    else:
        teacher = load_teacher(source[len(TEACHER_PREFIX):], env_cfg)
        if teacher.privileged:
            env_cfg = dataclasses.replace(env_cfg, privileged_states=True)
    env_cfg = dataclasses.replace(env_cfg, num_envs=1, render_video=False)
    # as collection.json will hold it (tuples become lists), so that an append compares like with like
    collection = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(env_cfg).items()
                                        if k not in NOT_COLLECTION}))
    check_appendable(cfg.collect.out, collection)
    return Plan(env_cfg, teacher, collection)


def check_appendable(root: str, env: Dict[str, object]) -> None:
    """An existing dataset of another env config is refused before any worker starts (the writer
    checks it again, with the frame rate and the features, once an env is built)."""
    if not os.path.isfile(os.path.join(root, fmt.COLLECTION_PATH)):
        return
    stored = fmt.read_json(root, fmt.COLLECTION_PATH).get("env")
    differ = sorted(k for k in set(stored or {}) | set(env) if stored is not None and stored.get(k) != env.get(k))
    if differ:
        raise ConfigError(f"{root} was collected in another env config (" + ", ".join(
            f"env.{k}: {stored.get(k)!r} there, {env.get(k)!r} here" for k in differ[:6]) + "): write these episodes "
            "to another --out, or collect with the dataset's config")


def load_teacher(folder: str, env_cfg) -> Teacher:
    """The teacher's run config, checked against the env it is to act in."""
    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.config.validate import to_train_config
    from embodied_async.run_folder import is_checkpoint, run_config_path

    named = f"--source {TEACHER_PREFIX}{folder}"
    if not is_checkpoint(folder):
        raise ConfigError(f"{named}: not a checkpoint folder of a run (one holds runner.json and manifest.json, e.g. "
                          "logs/<run>/checkpoints/global_step_<N>)")
    if not os.path.isfile(run_config_path(folder)):
        raise ConfigError(f"{named}: its run's config {run_config_path(folder)} is missing, so what the teacher "
                          "observes and how it acts is unknown: use a checkpoint inside its run's log folder")
    raw = checkpoint_config(folder)
    raw.cluster.device_type, raw.runner.dry_run = "cpu", False  # the teacher acts in a collection worker
    cfg = to_train_config(raw)
    theirs, ours = acting_settings(cfg.env), acting_settings(env_cfg)
    if theirs != ours:
        differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise ConfigError("the teacher was trained on " + _describe(theirs, differ) + ", this env is "
                          + _describe(ours, differ) + ": collect in the teacher's task and control mode (e.g. "
                          + " ".join(f"env.{k}={theirs.get(k)}" for k in differ if k != "name") + ")")
    if int(cfg.env.num_action_chunks) != 1:
        raise ConfigError(f"the teacher acts in chunks of {cfg.env.num_action_chunks} actions (its "
                          "env.num_action_chunks); the collector records single actions: use a teacher trained with "
                          "env.num_action_chunks=1")
    privileged = cfg.env.observes_states()
    if privileged and not hook(env_cfg, "supports_privileged_states"):
        raise ConfigError(f"the teacher was trained on state observations, and the '{env_cfg.name}' env family "
                          "cannot give them beside its own (env.privileged_states)")
    return Teacher(cfg.model, folder, privileged)


def acting_settings(env_cfg) -> Dict[str, object]:
    """What decides what an action does in an env: family, task, robot and control keys."""
    keys = ("name", env_cfg.task_key, env_cfg.robot_key, *hook(env_cfg, "control_keys"))
    return {key: getattr(env_cfg, key) for key in keys if key}


def _describe(keys: Dict[str, object], differ: List[str]) -> str:
    return " ".join(f"{k}={keys.get(k)!r}" for k in differ)


def first_episode(root: str, seed: int) -> int:
    """Episode numbers continue after the highest seed already stored (no episode twice)."""
    if not os.path.isfile(os.path.join(root, fmt.COLLECTION_PATH)):
        return 0
    seeds = [int(e["seed"]) for e in fmt.read_json(root, fmt.COLLECTION_PATH).get("episodes", []) if "seed" in e]
    return max([0] + [s - seed + 1 for s in seeds])


def open_writer(collect_cfg, plan: Plan, spec):
    """The dataset writer for the env a worker built (``spec``: its EnvSpec)."""
    from embodied_async.datasets.batches import dataset_features
    from embodied_async.datasets.writer import DatasetWriter

    hz = spec.control_hz
    if hz is None or abs(hz - round(hz)) > 1e-6:
        raise ConfigError(f"the '{plan.env_cfg.name}' env gives no whole control rate (EnvSpec.control_hz={hz}); a "
                          "LeRobot dataset's fps is the rate its actions were executed at")
    if not spec.reports_success and not collect_cfg.keep_failures:
        raise ConfigError("this task reports no success, so no episode would be kept: pass --keep-failures")
    return DatasetWriter(collect_cfg.out, int(round(hz)), dataset_features(spec), robot_type=plan.env_cfg.robot_name(),
                         video_codec=collect_cfg.codec, collection={"env": plan.collection_env})


# ---- in a collection worker: the source and its episodes --------------------------------------------

def build_source(plan: Plan, env) -> Callable:
    """``obs -> actions [1, C, A]`` (numpy) of the plan's source in ``env``."""
    if plan.teacher is None:
        import importlib

        module, _, name = hook(plan.env_cfg, "scripted_expert").partition(":")
        return getattr(importlib.import_module(module), name)(plan.env_cfg, env)
    return _teacher_source(plan.teacher, env)


def _teacher_source(teacher: Teacher, env) -> Callable:
    import torch

    from embodied_async.registry import build_policy
    from embodied_async.run_folder import load_policy_weights

    spec = env.spec
    shapes = {k: v for k, v in spec.obs_shapes.items() if k != "privileged_states"}
    if teacher.privileged:
        shapes = {"states": spec.obs_shapes["privileged_states"]}
    their_spec = dataclasses.replace(spec, obs_shapes=shapes,
                                     obs_dtypes={k: spec.obs_dtypes.get(k, "float32") for k in shapes})
    policy = build_policy(teacher.model_cfg, their_spec, device=torch.device("cpu")).eval()
    try:
        load_policy_weights(policy, teacher.checkpoint)
    except (KeyError, ValueError) as err:
        seen = f"states of {shapes['states'][0]} values (the env's privileged states)" if teacher.privileged \
            else f"observations {shapes}"
        raise ValueError(f"the teacher {teacher.checkpoint} does not fit {seen}: {err}") from None

    def act(obs):
        given = {k: v for k, v in obs.items() if k != "privileged_states"}
        if teacher.privileged:
            given = {"states": obs["privileged_states"], "task_descriptions": obs["task_descriptions"]}
        with torch.no_grad():
            return policy.predict(given, mode="eval").actions.float().cpu().numpy()

    return act


def run_episode(env, act: Callable, seed: int) -> dict:
    """One episode from a reset with ``seed``: the recorded frames, success and return."""
    low, high = np.asarray(env.spec.action_low), np.asarray(env.spec.action_high)
    obs = env.reset(seed=seed).obs
    frames: Dict[str, list] = {RECORDED[k]: [] for k in RECORDED if k in obs}
    actions, total = [], 0.0
    while True:
        chunk = np.asarray(act(obs), dtype=np.float32)
        for key in RECORDED:
            if key in obs:
                frames[RECORDED[key]].append(np.asarray(obs[key][0]))
        actions.append(np.clip(chunk[0, 0], low, high))  # what the env executes
        out = env.step(chunk)
        total += float(out.rewards[0])
        if out.dones[0]:
            break
        obs = out.obs
    episode = {key: np.stack(values) for key, values in frames.items()}
    episode[ACTION_KEY] = np.stack(actions).astype(np.float32)
    return {"frames": episode, "task": str(obs["task_descriptions"][0]), "success": bool(out.successes[0]),
            "return_": total}
