"""Named rewards computed from a task's ``info`` (``env.reward``), for tasks that pay none.

ManiSkill's Bridge digital twins support only ``reward_mode="none"``: they pay 0 and report
progress in ``info`` instead. A named reward turns that progress into a step reward.

``grasp_place`` (the shaping RLinf trains OpenVLA with on these tasks): a potential

    0.1 * grasped + 0.1 * sustained_grasp + 1.0 * (success and grasped)

where ``grasped`` (``info["is_src_obj_grasped"]``) and ``sustained_grasp``
(``info["consecutive_grasp"]``: held for 5 steps in a row) stay true for the rest of the episode
once reached, and ``success`` (the object rests on the target) holds only while it does. The
step reward is the change of the potential since the previous step (0 before the first step of
an episode), so an episode's rewards sum to its final potential (the twins end an episode at
success, so the success bonus is paid once). ``env.reward_weights`` overrides the weights
(keys ``grasp``, ``sustained_grasp``, ``success``).

``progress`` (for tasks with a dense reward, ``env.reward_mode=normalized_dense``): a potential

    0.5 * task_reward + 1.0 * success

paid as differences the same way, so an episode's return is its potential at its last step. A
success (ManiSkill's normalised dense reward is 1 there: 1.5) outranks every failure (< 0.5), and
failures rank by how close they ended. Group-relative advantages then learn from groups whose
episodes all fail, which a success reward drops; summing the dense reward itself would instead
pay a failure that lingers near the goal more than a quick success that ends the episode. Keys:
``progress``, ``success``.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np


class GraspPlaceReward:
    """Per sub-env potential differences; ``step`` for the rows that stepped, ``reset`` at episode ends."""

    INFO_KEYS = ("is_src_obj_grasped", "consecutive_grasp", "success")
    WEIGHTS = {"grasp": 0.1, "sustained_grasp": 0.1, "success": 1.0}
    DENSE_MODES = None  # the reward modes the task's own reward (info["task_reward"]) must be in, if read

    def __init__(self, num_envs: int, weights: Optional[Mapping[str, float]] = None):
        unknown = sorted(set(weights or {}) - set(self.WEIGHTS))
        if unknown:
            raise ValueError(f"env.reward_weights: unknown keys {unknown} for reward 'grasp_place'; "
                             f"known: {sorted(self.WEIGHTS)}")
        self.weights = {**self.WEIGHTS, **(weights or {})}
        self.previous = np.zeros(num_envs, dtype=np.float32)

    def potential(self, info: Mapping[str, np.ndarray]) -> np.ndarray:
        missing = [k for k in self.INFO_KEYS if k not in info]
        if missing:
            raise KeyError(f"reward 'grasp_place' needs info keys {list(self.INFO_KEYS)}; this task's info lacks "
                           f"{missing}. Use it with the Bridge digital twins, or set env.reward=null to use the "
                           "task's own reward (env.reward_mode)")
        grasped = np.asarray(info["is_src_obj_grasped"], dtype=bool)
        sustained = np.asarray(info["consecutive_grasp"], dtype=bool)
        success = np.asarray(info["success"], dtype=bool)
        w = self.weights
        return (w["grasp"] * grasped + w["sustained_grasp"] * sustained
                + w["success"] * (success & grasped)).astype(np.float32)

    def step(self, info: Mapping[str, np.ndarray], rows: Sequence[int]) -> np.ndarray:
        """The rewards of sub-envs ``rows`` (``info`` holds their entries, in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        potential = self.potential(info)
        reward = potential - self.previous[rows]
        self.previous[rows] = potential
        return reward

    def reset(self, rows: Sequence[int]) -> None:
        self.previous[np.asarray(rows, dtype=np.int64)] = 0.0


class ProgressReward(GraspPlaceReward):
    """The task's dense reward as a potential, plus a success bonus (see the module's docstring)."""

    INFO_KEYS = ("success",)
    WEIGHTS = {"progress": 0.5, "success": 1.0}
    DENSE_MODES = ("dense", "normalized_dense")

    def potential(self, info: Mapping[str, np.ndarray]) -> np.ndarray:
        success = np.asarray(info["success"], dtype=bool)
        task_reward = np.asarray(info["task_reward"], dtype=np.float32)
        return (self.weights["progress"] * task_reward + self.weights["success"] * success).astype(np.float32)


REWARDS: Dict[str, type] = {"grasp_place": GraspPlaceReward, "progress": ProgressReward}
