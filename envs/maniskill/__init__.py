"""ManiSkill3 adapter, registered in the env registry as ``"maniskill"``."""

from __future__ import annotations

from embodied_async.registry import register_env, register_env_check

from .maniskill_env import (
    ManiSkillEnv,
    bootstrap_flags,
    check_task_assets,
    task_instruction,
)

__all__ = [
    "ManiSkillEnv",
    "bootstrap_flags",
    "build_maniskill_env",
    "check_maniskill_config",
    "check_task_assets",
    "task_instruction",
]


@register_env("maniskill", module="envs.maniskill")
def build_maniskill_env(env_cfg, num_envs: int, seed: int, rank: int = 0) -> ManiSkillEnv:
    """Build ``num_envs`` ManiSkill sub-environments described by ``env_cfg`` (an ``EnvConfig``).

    ``rank`` is accepted for the registry's builder signature; seeding is the caller's job
    (each env worker passes its own ``seed``).
    """
    return ManiSkillEnv(env_cfg, num_envs=num_envs, seed=seed)


@register_env_check("maniskill")
def check_maniskill_config(env_cfg) -> None:
    """Start-up check: ``env.task_id`` must be a ManiSkill task (ValueError listing close matches).

    Missing assets are not a config error: the env worker reports them with the download command
    (``check_task_assets``), and a machine that only validates configs need not hold them.
    """
    try:
        check_task_assets(env_cfg.task_id)
    except FileNotFoundError:
        pass
