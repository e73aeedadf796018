"""The LIBERO env in our venv: a ``SerialEnv`` whose sub-envs are LIBERO simulators in child
processes under ``.venv-libero`` (``libero_child.LiberoSubEnv``)."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from embodied_async.contracts import EnvSpec, ResetSeed
from embodied_async.data import EnvOutput
from embodied_async.isolated.child import ChildSubEnv
from embodied_async.serial_env import SerialEnv
from envs.libero.configuration_libero import CHILD, LiberoConfig

ACTION_DIM = 7  # end-effector delta position (3) and rotation (3), the gripper (-1 open, +1 closed)
CONTROL_HZ = 20.0  # LIBERO's control frequency


def task_places(tasks: Sequence[str]) -> List[int]:
    """Each sub-env's place among the sub-envs of its task (``tasks``: each sub-env's): a task's
    sub-envs go through its initial states together, sub-env ``place`` of ``count`` taking states
    ``place``, ``place + count``, ..."""
    return [list(tasks[:i]).count(task) for i, task in enumerate(tasks)]


class LiberoEnv(SerialEnv):
    def __init__(self, env_cfg: LiberoConfig, num_envs: int, seed: int = 0):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.cfg = env_cfg
        subs = []
        configs = env_cfg.task_configs(int(num_envs))
        tasks = [each.task for each in configs]
        self.places = task_places(tasks)
        try:
            for each, place in zip(configs, self.places):
                subs.append(ChildSubEnv(env_cfg.name, env_cfg.python_env, f"{CHILD}:build_sub_env",
                                        {**each.child_config(), "place": place, "count": tasks.count(each.task)},
                                        wait=False))
            for sub in subs:  # the children build their scenes at once
                sub.ready()
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

    def reset(self, seed: ResetSeed = None) -> EnvOutput:
        """An int ``seed`` starts the sub-env at place ``k`` among its task's sub-envs from initial
        state ``seed + k``: ``seed=0`` runs each task's states 0, 1, 2, ... as the published
        evaluations do (with several tasks too); a list gives each sub-env its own."""
        if isinstance(seed, (int, np.integer)):
            seed = [int(seed) + place for place in self.places]
        return super().reset(seed)


def build_libero_env(env_cfg: LiberoConfig, num_envs: int, seed: int) -> LiberoEnv:
    return LiberoEnv(env_cfg, num_envs, seed)
