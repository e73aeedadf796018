"""ManiSkill3 env family (``env.name: maniskill``): ``configuration_maniskill`` holds its config,
``maniskill_env`` the batched env (ManiSkill itself is imported only where an env is built)."""

from __future__ import annotations

from .configuration_maniskill import ManiSkillConfig
from .maniskill_env import ManiSkillEnv, bootstrap_flags, check_task_assets, task_instruction

__all__ = ["ManiSkillConfig", "ManiSkillEnv", "bootstrap_flags", "check_task_assets", "task_instruction"]
