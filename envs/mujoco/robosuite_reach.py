"""``Reach`` (``env.name: robosuite``, ``env.task: Reach``): move the gripper to a target drawn above
the table, for any robosuite robot (robosuite has no reaching task; it is the quickest to learn on a
CPU). Defining the class registers it with robosuite: ``robosuite_tasks`` imports this module on
first use, robosuite being needed only by runs that name it."""

from __future__ import annotations

import numpy as np
from robosuite.environments.manipulation.manipulation_env import ManipulationEnv
from robosuite.models.arenas import TableArena
from robosuite.models.tasks import ManipulationTask
from robosuite.utils.mjcf_utils import new_body, new_geom
from robosuite.utils.observables import Observable, sensor

REACH_SUCCESS_DISTANCE = 0.05  # metres between the gripper and the target


class Reach(ManipulationEnv):
    """Reach a target (a red ball without collisions) drawn uniformly in a box above the table
    at every reset. Shaped reward: 1 - tanh(10 x distance); sparse: 1 within 5 cm."""

    target_low = np.array([-0.15, -0.15, 0.85])
    target_high = np.array([0.15, 0.15, 1.05])

    def __init__(self, robots, reward_shaping=True, table_full_size=(0.8, 0.8, 0.05), **kwargs):
        self.reward_shaping = reward_shaping
        self.table_full_size = table_full_size
        self.table_offset = np.array((0, 0, 0.8))
        self.use_object_obs = True
        self.target = (self.target_low + self.target_high) / 2
        super().__init__(robots=robots, **kwargs)

    def _load_model(self):
        super()._load_model()
        self.robots[0].robot_model.set_base_xpos(
            self.robots[0].robot_model.base_xpos_offset["table"](self.table_full_size[0]))
        arena = TableArena(table_full_size=self.table_full_size, table_offset=self.table_offset)
        arena.set_origin([0, 0, 0])
        self.model = ManipulationTask(mujoco_arena=arena, mujoco_robots=[r.robot_model for r in self.robots])
        body = new_body(name="reach_target", pos=self.target)
        body.append(new_geom(name="reach_target_ball", type="sphere", size=[0.02], rgba=[1, 0, 0, 0.8],
                             contype=0, conaffinity=0, group=1))
        self.model.worldbody.append(body)

    def _setup_references(self):
        super()._setup_references()
        self.target_body_id = self.sim.model.body_name2id("reach_target")

    def _setup_observables(self):
        observables = super()._setup_observables()

        @sensor(modality="object")
        def target_pos(obs_cache):
            return np.array(self.target)

        @sensor(modality="object")
        def gripper_to_target(obs_cache):
            return np.array(self.target) - self._eef_position()

        for fn in (target_pos, gripper_to_target):
            observables[fn.__name__] = Observable(name=fn.__name__, sensor=fn, sampling_rate=self.control_freq)
        return observables

    def _reset_internal(self):
        super()._reset_internal()
        self.target = np.random.uniform(self.target_low, self.target_high)
        self.sim.model.body_pos[self.target_body_id] = self.target
        self.sim.forward()

    def _eef_position(self) -> np.ndarray:
        gripper = self.robots[0].gripper
        gripper = gripper["right"] if isinstance(gripper, dict) else gripper
        return np.array(self.sim.data.site_xpos[self.sim.model.site_name2id(gripper.important_sites["grip_site"])])

    def _distance(self) -> float:
        return float(np.linalg.norm(self._eef_position() - self.target))

    def reward(self, action=None):
        if self.reward_shaping:
            return 1.0 - float(np.tanh(10.0 * self._distance()))
        return float(self._check_success())

    def _check_success(self):
        return self._distance() < REACH_SUCCESS_DISTANCE
