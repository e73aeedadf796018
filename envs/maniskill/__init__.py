"""ManiSkill3 env family (``env.name: maniskill``): ``configuration_maniskill`` holds its config,
``tasks`` the checks of a task (its id, assets, modes and robots) that the config and the env
share, ``maniskill_env`` the batched env (built through ``gym_make``). The names below are imported
on first use, so loading the family's config (every run does) imports neither the env module nor
ManiSkill."""

import importlib

_MODULE_OF = {"ManiSkillConfig": "configuration_maniskill", "ManiSkillEnv": "maniskill_env",
              "bootstrap_flags": "maniskill_env", "check_task_assets": "tasks", "check_task_modes": "tasks",
              "check_task_robot": "tasks", "task_instruction": "tasks"}

__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'envs.maniskill' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
