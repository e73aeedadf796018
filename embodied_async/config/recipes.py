"""A run's config composed from what a user names: a recipe (``configs/<name>.yaml``), a run's
checkpoint (the run's saved config), or a model (a folder or hub id, under its family's recipe),
with ``key=value`` overrides on top (``env=<yaml>`` / ``model=<yaml>`` pick a group's file).

The launcher composes through Hydra itself; every other command composes here, and asks a family
what it needs to know of it through its hooks (``default_recipe``, ``recognizes``,
``renamed_recipe_parts``: ``config/family_hooks.py``).
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence, Tuple

from embodied_async.config.checks import ConfigError
from embodied_async.config.family_hooks import hook

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
GROUPS = ("env", "model")
LOG_PATH_KEY = "runner.logger.log_path"


def default_recipe() -> str:
    """The recipe ``configs/defaults/recipe.yaml`` names: trained when none is named, and the one
    an env yaml alone is composed into."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(os.path.join(CONFIG_DIR, "defaults", "recipe.yaml")).name)


def recipe_names() -> list:
    names = (name[:-5] for name in os.listdir(CONFIG_DIR) if name.endswith(".yaml"))
    return sorted(name for name in names if name != "train_schema")


def group_names(group: str) -> list:
    return sorted(name[:-5] for name in os.listdir(os.path.join(CONFIG_DIR, group)) if name.endswith(".yaml"))


def renamed_recipe(recipe: str) -> Optional[str]:
    """The new name of a recipe that was renamed (the families' ``renamed_recipe_parts``: recipes are
    named by the family they train), None when ``recipe`` is not such a name."""
    from embodied_async.registry import families

    if os.path.isfile(os.path.join(CONFIG_DIR, f"{recipe}.yaml")):
        return None
    for cls in families("model").values():
        for old, new in hook(cls, "renamed_recipe_parts").items():
            renamed = recipe.replace(old, new)
            if old in recipe and os.path.isfile(os.path.join(CONFIG_DIR, f"{renamed}.yaml")):
                return renamed
    return None


def check_recipe_name(recipe: str) -> None:
    """ConfigError naming the new name of a renamed recipe, or the recipes there are."""
    renamed = renamed_recipe(recipe)
    if renamed:
        raise ConfigError(f"the recipe {recipe!r} is now {renamed!r} (recipes are named by the family they train): "
                          f"use {renamed}")
    if not os.path.isfile(os.path.join(CONFIG_DIR, f"{recipe}.yaml")):
        raise ConfigError(f"no recipe {recipe!r} (configs/{recipe}.yaml); the recipes: {', '.join(recipe_names())}")


def with_log_path(recipe: str, overrides: Sequence[str]) -> list:
    """``overrides`` with the recipe's log folder, ``logs/<recipe>``, unless they name one: a recipe
    states no log folder of its own (``scripts/run_async.sh`` names a dated one)."""
    named = any(item.startswith(f"{LOG_PATH_KEY}=") for item in overrides)
    return list(overrides) if named else [f"{LOG_PATH_KEY}=logs/{recipe}", *overrides]


def command_config(raw, setting: dict, overrides: Sequence[str], log_name: str):
    """``raw`` (a composed config) with a command's ``setting`` (``key: value``) in place, logging
    to ``logs/<time>-<log_name>`` unless ``overrides`` name a log folder; then validated:
    ``(TrainConfig, Topology)``."""
    import time

    from omegaconf import OmegaConf

    from embodied_async.config.validate import resolve

    setting = dict(setting)
    if not any(item.startswith(f"{LOG_PATH_KEY}=") for item in overrides):
        setting[LOG_PATH_KEY] = f"logs/{time.strftime('%Y%m%d-%H%M%S')}-{log_name}"
    for key, value in setting.items():
        OmegaConf.update(raw, key, value, merge=False)
    return resolve(raw)


def recipe_section(recipe: str, section: str) -> dict:
    """The ``section`` (e.g. ``model``) as ``configs/<recipe>.yaml`` writes it over the recipes it
    extends (their files, not the config groups' defaults nor Hydra's composition): what a recipe
    itself says, read without composing it."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, f"{recipe}.yaml")))
    values: dict = {}
    for parent in raw.get("defaults", []):
        if isinstance(parent, str) and os.path.isfile(os.path.join(CONFIG_DIR, f"{parent}.yaml")):
            values.update(recipe_section(parent, section))
    values.update(raw.get(section) or {})
    return values


def compose_recipe(recipe: str, overrides: Sequence[str] = ()):
    """``configs/<recipe>.yaml`` composed by Hydra with ``overrides`` (a ``DictConfig``, not yet
    validated; the log folder ``logs/<recipe>`` unless they name one); ConfigError naming the recipe
    when it is missing or does not compose."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from embodied_async.config.hydra_schema import register_schema

    check_recipe_name(recipe)
    register_schema()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        try:
            return compose(config_name=recipe, overrides=with_log_path(recipe, overrides))
        except (HydraException, OmegaConfBaseException) as err:
            raise ConfigError(f"{recipe} with {list(overrides)}: {err}") from None


def resolve_recipe(recipe: str, overrides: Sequence[str] = ()):
    """``compose_recipe`` then validation: ``(TrainConfig, Topology)``."""
    from embodied_async.config.validate import resolve

    return resolve(compose_recipe(recipe, overrides))


def apply_overrides(raw, overrides: Sequence[str]):
    """A composed config (e.g. a run's saved one) + ``key=value`` overrides, with ``env=<yaml>`` /
    ``model=<yaml>`` replacing that section by the group's file as Hydra would compose it. A new
    env keeps the policy's ``num_action_chunks`` (the policy was trained to execute chunks of it)."""
    from omegaconf import OmegaConf

    plain, groups = [], {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key in GROUPS:
            groups[key] = value
        else:
            plain.append(item)
    for group, name in groups.items():
        path = os.path.join(CONFIG_DIR, group, f"{name}.yaml")
        if not os.path.isfile(path):
            raise ConfigError(f"{group}={name}: no configs/{group}/{name}.yaml; the choices: "
                              f"{', '.join(group_names(group))}")
        section = OmegaConf.load(path)
        family = _schema_family(section.pop("defaults", []))
        kept = {"num_action_chunks": raw.env.get("num_action_chunks", 1)} if group == "env" else {}
        raw[group] = OmegaConf.merge({"name": family}, kept, section)
    return OmegaConf.merge(raw, OmegaConf.from_dotlist(plain))


def _schema_family(defaults) -> str:
    """The family a group file types itself by (its ``<family>_schema`` default)."""
    return next(str(d)[: -len("_schema")] for d in defaults if str(d).endswith("_schema"))


def checkpoint_config(checkpoint: str, overrides: Sequence[str] = ()):
    """The composed config of the run that wrote ``checkpoint``, with ``overrides`` on top."""
    from embodied_async.checkpoint_io import CheckpointError
    from embodied_async.run_folder import load_run_config

    try:
        raw = load_run_config(checkpoint)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
    _saved_logger_choice(raw)
    return apply_overrides(raw, overrides) if overrides else raw


def _saved_logger_choice(raw) -> None:
    """A run saved before ``runner.logger.backends`` chose TensorBoard with a switch: its choice,
    in today's key (a user is refused the old key; a saved config is read as it was meant)."""
    from omegaconf import open_dict

    logger = raw.get("runner", {}).get("logger")
    if logger is None or logger.get("tensorboard") is None:
        return
    with open_dict(raw):
        enabled = bool(logger.pop("tensorboard"))
        if "backends" not in logger:
            logger.backends = ["tensorboard"] if enabled else []


def model_family(target: str) -> str:
    """The policy family a model folder or hub id holds, as the families' config classes recognise
    it (their ``recognizes`` hook); ConfigError when none or several do."""
    from embodied_async.registry import families

    path = os.path.join(target, "config.json")
    config = None
    if os.path.isfile(path):
        with open(path) as f:
            config = json.load(f)
    claimed = [name for name, cls in families("model").items()
               if hook(cls, "recognizes") is not None and cls.recognizes(target, config)]
    if len(claimed) != 1:
        raise ConfigError(f"{target}: cannot tell which policy family it holds ({'none' if not claimed else claimed} "
                          "recognises it); pass the recipe to evaluate it under")
    return claimed[0]


def model_config(target: str, recipe: Optional[str], overrides: Sequence[str] = ()):
    """A model (folder or hub id) under ``recipe`` (by default its family's ``default_recipe``)."""
    from embodied_async.registry import family_config

    if recipe is None:
        family = model_family(target)
        recipe = hook(family_config("model", family), "default_recipe")
        if recipe is None:
            raise ConfigError(f"{target}: the '{family}' policy family names no default recipe; pass one")
    raw = compose_recipe(recipe, [f"model.path={target}", *overrides])
    if "tiny_random_init" in raw.model:  # the folder is the model: nothing to make there
        raw.model.tiny_random_init = False
    return raw


def target_config(target: str, overrides: Sequence[str] = (), recipe: Optional[str] = None
                  ) -> Tuple[object, Optional[str]]:
    """What a script is pointed at, as ``(composed config, checkpoint or None)``: a run's checkpoint
    (under its run's config, or under ``recipe`` when one is named), or a model under ``recipe``."""
    from embodied_async.run_folder import RUNNER_STATE, checkpoints_held, is_checkpoint

    if is_checkpoint(target):
        if recipe is not None:  # named by the user: e.g. a checkpoint whose run's folder is gone
            return compose_recipe(recipe, overrides), target
        return checkpoint_config(target, overrides), target
    if os.path.isfile(os.path.join(target, RUNNER_STATE)):
        raise ConfigError(f"{target} holds {RUNNER_STATE} but no manifest.json: a checkpoint that was never completed "
                          "(or was damaged); use another checkpoint of the run")
    held = checkpoints_held(target)
    if held:  # a run's log folder or its checkpoints root
        raise ConfigError(f"{target} is not a checkpoint but holds a run's checkpoints: point at one of them, e.g. the "
                          f"newest, {held[0]}")
    return model_config(target, recipe, overrides), None


def env_target_config(target: str, overrides: Sequence[str]):
    """The composed config (not yet validated) of an env yaml (``configs/env/<target>.yaml``,
    composed into the default recipe) or of a recipe: what a collection is pointed at."""
    if os.path.isfile(os.path.join(CONFIG_DIR, "env", f"{target}.yaml")):
        recipe, overrides = default_recipe(), [f"env={target}", *overrides]
    elif os.path.isfile(os.path.join(CONFIG_DIR, f"{target}.yaml")):
        recipe = target
    else:
        raise ConfigError(f"{target!r} is neither an env yaml of configs/env/ ({', '.join(group_names('env'))}) nor "
                          "a recipe of configs/: fix the name")
    return compose_recipe(recipe, overrides)


def family_python_envs(recipe: str, overrides: Sequence[str] = ()) -> list:
    """The Python environments of their own (``EnvConfig.python_env``) the families of ``recipe``
    with ``overrides`` run in: what ``scripts/run_async.sh`` sets up before a run."""
    from embodied_async.registry import family_config

    raw = compose_recipe(recipe, overrides)
    python_env = family_config("env", raw.env.name).python_env
    return [python_env] if python_env else []


if __name__ == "__main__":  # python -m embodied_async.config.recipes RECIPE [key=value ...]: those environments
    import sys

    try:
        print(" ".join(family_python_envs(sys.argv[1], sys.argv[2:])))
    except ConfigError as err:  # the run itself reports a bad recipe or override
        print(f"[recipes] {err}", file=sys.stderr)
