"""The LIBERO env in our venv: a ``SerialEnv`` whose sub-envs are LIBERO simulators in child
processes under ``.venv-libero`` (``libero_child.LiberoSubEnv``)."""

from __future__ import annotations

import numpy as np

from embodied_async.contracts import EnvSpec
from embodied_async.isolated.child import ChildSubEnv
from embodied_async.serial_env import SerialEnv
from envs.libero.configuration_libero import CHILD, LiberoConfig

ACTION_DIM = 7  # end-effector delta position (3) and rotation (3), the gripper (-1 open, +1 closed)
CONTROL_HZ = 20.0  # LIBERO's control frequency


class LiberoEnv(SerialEnv):
    def __init__(self, env_cfg: LiberoConfig, num_envs: int, seed: int = 0):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.cfg = env_cfg
        subs = []
        try:
            for each in env_cfg.task_configs(int(num_envs)):
                subs.append(ChildSubEnv(env_cfg.name, env_cfg.python_env, f"{CHILD}:build_sub_env",
                                        each.child_config()))
        except BaseException:
            for sub in subs:
                sub.close()
            raise
        super().__init__(subs, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), env_cfg.terminal_on_success)
        self.instruction = self.subs[0].instruction
        self.spec = EnvSpec.from_observation(
            self.reset(seed).obs, action_dim=ACTION_DIM, num_action_chunks=int(env_cfg.num_action_chunks),
            action_low=self.action_low.tolist(), action_high=self.action_high.tolist(), instruction=self.instruction,
            reports_success=True, reports_fail=False, control_hz=CONTROL_HZ, tasks=env_cfg.sub_env_tasks(int(num_envs)))


def build_libero_env(env_cfg: LiberoConfig, num_envs: int, seed: int) -> LiberoEnv:
    return LiberoEnv(env_cfg, num_envs, seed)
