"""Meta-World tasks (Sawyer arm, e.g. ``reach-v3``) as sub-envs of ``MujocoEnv`` (``env.name: metaworld``).

Each reset draws a new goal variation of the task (Meta-World's MT1). Its observation holds the
hand position and gripper opening (the proprioception), two objects' poses, the previous frame's
and the goal position; its reward is up to 10 per step.
"""

from __future__ import annotations

import difflib
import re
from typing import Tuple

import numpy as np

from .configuration_mujoco import NO_CAMERA, MetaWorldConfig
from .gym_task import GymTask

INSTRUCTIONS = {
    "reach-v3": "move the gripper to the goal position",
    "reach-wall-v3": "reach the goal position behind the wall",
    "push-v3": "push the puck to the goal position",
    "pick-place-v3": "pick up the puck and place it at the goal position",
    "door-open-v3": "open the door",
    "door-close-v3": "close the door",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "close the drawer",
    "button-press-v3": "press the button",
    "button-press-topdown-v3": "press the button from the top",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "basketball-v3": "put the ball into the basket",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "plate-slide-v3": "slide the plate into the goal",
    "lever-pull-v3": "pull the lever up",
    "handle-press-v3": "press the handle down",
    "coffee-push-v3": "push the mug under the coffee machine",
    "sweep-into-v3": "sweep the puck into the hole",
    "assembly-v3": "put the ring onto the peg",
}
PROPRIO = slice(0, 4)  # hand xyz and the gripper's opening
# cameras mounted upside down in Meta-World's model: their images are turned by 180 degrees
UPSIDE_DOWN = {"corner", "corner2", "corner3", "corner4"}


class Task(GymTask):
    upside_down_cameras = UPSIDE_DOWN

    def __init__(self, cfg: MetaWorldConfig, seed: int):
        import gymnasium as gym
        import metaworld  # noqa: F401  (registers Meta-World/MT1)

        super().__init__(gym.make("Meta-World/MT1", env_name=cfg.task, seed=int(seed)), seed)
        self.instruction = INSTRUCTIONS.get(cfg.task) or " ".join(re.sub(r"-v\d+$", "", cfg.task).split("-"))
        self.default_cameras = ("corner2", "gripperPOV")

    def reset(self) -> None:
        seed = self._take_seed()
        if seed is not None:  # Meta-World ignores reset(seed=...): its env has its own seed()
            self.env.unwrapped.seed(seed)
        self._obs, _ = self.env.reset()

    def step(self, action) -> Tuple[float, bool, bool]:
        self._obs, reward, _, _, info = self.env.step(action)
        return float(reward), bool(info["success"] > 0.5), False

    def state(self, full: bool) -> np.ndarray:
        obs = np.asarray(self._obs, dtype=np.float32)
        return obs if full else obs[PROPRIO]

    @classmethod
    def check_names(cls, cfg: MetaWorldConfig) -> None:
        import metaworld

        tasks = list(metaworld.ALL_V3_ENVIRONMENTS)
        if cfg.task not in tasks:
            close = difflib.get_close_matches(cfg.task, tasks, n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise ValueError(f"env.task={cfg.task!r} is not a Meta-World task{hint}; "
                             f"Meta-World ships: {', '.join(tasks)}")
        cameras = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
        for key, name in (("env.main_camera", cfg.main_camera), ("env.wrist_camera", cfg.wrist_camera)):
            if name not in (None, NO_CAMERA) and name not in cameras:
                raise ValueError(f"{key}={name!r} is not a Meta-World camera; its cameras: {', '.join(cameras)} "
                                 "(or 'none')")


class ScriptedExpert:
    """Meta-World's scripted policy of each sub-env's task (``metaworld.policies``) on a
    ``MujocoEnv``: it reads each simulator's own 39-value observation, not the env's (an rgb
    env gives only the proprioception)."""

    def __init__(self, env, policies):
        self.env, self.policies = env, policies  # one per sub-env

    def __call__(self, obs) -> np.ndarray:
        actions = np.asarray([policy.get_action(sub.state(full=True).astype(np.float64))
                              for policy, sub in zip(self.policies, self.env.sub_envs)], dtype=np.float32)
        # its gains ask for more than the env executes: give the executed action (a dataset's)
        low, high = np.asarray(self.env.spec.action_low), np.asarray(self.env.spec.action_high)
        return np.clip(actions, low, high).astype(np.float32)[:, None, :]


def build_expert(env_cfg: MetaWorldConfig, env) -> ScriptedExpert:
    """The expert of each sub-env's task, ``env.task`` or those of ``env.tasks`` (``env.scripted_expert``
    of the Meta-World family)."""
    from metaworld.policies import ENV_POLICY_MAP

    missing = [task for task in (list(env_cfg.tasks) or [env_cfg.task]) if task not in ENV_POLICY_MAP]
    if missing:  # refused from the config, before the env is read
        raise ValueError(f"Meta-World has no scripted policy for env.task={missing[0]!r}; it has them for: "
                         f"{', '.join(sorted(ENV_POLICY_MAP))}")
    tasks = env_cfg.sub_env_tasks(env.num_envs) or (env_cfg.task,) * env.num_envs
    policies = {task: ENV_POLICY_MAP[task]() for task in set(tasks)}  # stateless: one per task serves all
    return ScriptedExpert(env, [policies[task] for task in tasks])
