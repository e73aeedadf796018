"""What a command or a mode asks of a family beyond building and checking it, and where the family
says it: a class attribute of its registered config (``configuration_<package>.py``), read through
``hook`` with the default below where the family says nothing. The base config classes
(``schema.EnvConfig`` / ``ModelConfig``) hold what every run reads; these belong to the commands
and modes named beside each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict


@dataclass(frozen=True)
class Hook:
    default: Any
    read_by: str  # the command or mode that asks
    meaning: str


ENV_HOOKS: Dict[str, Hook] = {
    "scripted_expert": Hook(None, "runner.mode=collect (collection.py)",
                            '"module:callable" building the family\'s expert, expert(env_cfg, env): a callable '
                            "obs -> actions [B, C, A] that solves the configured task (None: the family has none)"),
    "supports_privileged_states": Hook(False, "env.privileged_states (validation), a teacher's collection",
                                       "whether its observations can carry privileged_states, the task's state "
                                       "vector, beside its own"),
    "control_keys": Hook((), "a teacher's collection (collection.acting_settings)",
                         'keys beside the task and the robot that decide what an action does (e.g. "control_mode"): '
                         "a teacher's actions mean the same only where they agree"),
}
MODEL_HOOKS: Dict[str, Hook] = {
    "default_recipe": Hook(None, "eval / export of a model folder or hub id (config/recipes.py)",
                           "the recipe a model of the family is evaluated under by default (None: the user names one)"),
    "recognizes": Hook(None, "eval / export of a model folder or hub id (config/recipes.model_family)",
                       "classmethod (target, its config.json or None) -> whether it holds a checkpoint of the family"),
    "cpu_recipe": Hook(None, "a GPU recipe on a machine without GPUs (config/topology.py)",
                       "the recipe to suggest instead"),
    "renamed_recipe_parts": Hook({}, "a recipe named the old way (config/recipes.renamed_recipe)",
                                 "parts of recipe names the family's recipes no longer use -> what stands there now"),
    "exporter": Hook(None, "the export command (export.py)",
                     '"module:callable" writing a trained policy in the family\'s own published format '
                     "(export.ExportRequest -> ExportResult); None: an export is refused naming it"),
}


def hook(family, name: str):
    """The hook ``name`` of ``family`` (its config, or its config class), or the hook's default."""
    from embodied_async.config.schema import EnvConfig

    cls = family if isinstance(family, type) else type(family)
    table = ENV_HOOKS if issubclass(cls, EnvConfig) else MODEL_HOOKS
    return getattr(cls, name, table[name].default)
