"""Scripted experts for a few ManiSkill tasks: closed-loop controllers of ours that read the true
sim state (the ``env.scripted_expert`` of the ManiSkill family; ``python -m embodied_async collect
--source scripted`` uses them).

Each task's controller picks, from the state alone (no memory, so it needs nothing at an
auto-reset), a target position of the tool centre point (TCP) and a gripper command; the target
becomes an action of the env's control mode: an end-effector delta (``pd_ee_delta_pos`` /
``pd_ee_delta_pose``) or joint deltas (``pd_joint_delta_pos``, one differential-IK step on the
arm's kinematic model, the one ManiSkill's end-effector controllers use on the CPU backend).
ManiSkill's motion planner (mplib) is not used: it crashes under numpy 2.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np

CONTROL_MODES = ("pd_ee_delta_pos", "pd_ee_delta_pose", "pd_joint_delta_pos")
ROBOTS = (None, "panda")
OPEN, CLOSED = 1.0, -1.0  # the gripper's normalised command (pd_joint_pos: -1 closed, +1 open)
# metres the TCP target may lie from the TCP: a far target is approached in steps (the end-effector
# controllers' own limit per step; the joint-delta path scales its joint step to its limit)
MAX_STEP = 0.1
PUSH_LEAD = 0.05  # metres ahead of the cube's back face the TCP aims while pushing


def _p(actor) -> np.ndarray:
    """An actor's or link's world position as float64 ``[n, 3]``."""
    return actor.pose.p.detach().cpu().numpy().astype(np.float64).reshape(-1, 3)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def push_cube(base) -> Tuple[np.ndarray, np.ndarray]:
    """PushCube-v1: go above a point behind the cube (on the line from the goal through it), come
    down to the cube's mid-height, then push it towards the goal, tracking its centre."""
    tcp, cube, goal = _p(base.agent.tcp), _p(base.obj), _p(base.goal_region)
    half = float(base.cube_half_size)
    direction = _unit(goal[:, :2] - cube[:, :2])
    side = np.stack([-direction[:, 1], direction[:, 0]], axis=1)
    rel = tcp[:, :2] - cube[:, :2]
    along, lateral = (rel * direction).sum(1), (rel * side).sum(1)
    behind = cube[:, :2] - direction * (half + 0.02)
    low, high = half, 2 * half + 0.04
    behind_cube = (along < -half) & (np.abs(lateral) < 0.015)
    pushing = behind_cube & (tcp[:, 2] < low + 0.015)
    above_start = np.linalg.norm(tcp[:, :2] - behind, axis=1) < 0.01
    near_cube = np.linalg.norm(rel, axis=1) < half + 0.04
    target = np.concatenate([behind, np.full((len(tcp), 1), high)], axis=1)
    # too low next to the cube, not behind it: straight up first, to pass over it
    rise = ~behind_cube & near_cube & (tcp[:, 2] < high - 0.01)
    target[rise] = np.concatenate([tcp[rise, :2], np.full((rise.sum(), 1), high)], axis=1)
    descend = above_start & ~pushing
    target[descend, 2] = low
    # push: the TCP just behind the cube's centre, moved forwards along the line to the goal
    ahead = cube[:, :2] + direction * (PUSH_LEAD - half)
    target[pushing] = np.concatenate([ahead[pushing], np.full((pushing.sum(), 1), low)], axis=1)
    return target, np.full(len(tcp), CLOSED)


def pick_cube(base) -> Tuple[np.ndarray, np.ndarray]:
    """PickCube-v1: open above the cube, come down around it, close, carry it to the goal."""
    tcp, cube, goal = _p(base.agent.tcp), _p(base.cube), _p(base.goal_site)
    half = float(base.cube_half_size)
    grasped = base.agent.is_grasping(base.cube).detach().cpu().numpy().reshape(-1).astype(bool)
    over = np.linalg.norm(tcp[:, :2] - cube[:, :2], axis=1) < 0.008
    around = over & (np.abs(tcp[:, 2] - cube[:, 2]) < 0.008)
    target = np.concatenate([cube[:, :2], cube[:, 2:] + half + 0.05], axis=1)
    target[over] = cube[over]
    gripper = np.where(around | grasped, CLOSED, OPEN)
    target[grasped] = goal[grasped]
    # closing takes a few steps: hold still around the cube until the grasp holds
    target[around & ~grasped] = cube[around & ~grasped]
    return target, gripper


# PullCube-v1 has PushCube's scene with the goal on the robot's side: moving the cube towards its
# goal from behind it is the same controller
TASKS: Dict[str, Callable] = {"PushCube-v1": push_cube, "PullCube-v1": push_cube, "PickCube-v1": pick_cube}


class ScriptedExpert:
    """``obs -> actions [B, 1, A]`` for a ``ManiSkillEnv``: reads each sub-env's true state
    (``env.task_envs``), not the observation, so it works with every obs mode."""

    def __init__(self, env, task: Callable, control_mode: str):
        self.env, self.task, self.control_mode = env, task, control_mode
        self._kinematics: Dict[int, object] = {}

    def __call__(self, obs) -> np.ndarray:
        rows = [self._action(base) for base in self.env.task_envs]
        return np.concatenate(rows).astype(np.float32)[:, None, :]

    def _action(self, base) -> np.ndarray:
        target, gripper = self.task(base)
        tcp = _p(base.agent.tcp)
        delta = target - tcp
        scale = np.minimum(1.0, MAX_STEP / np.maximum(np.linalg.norm(delta, axis=1, keepdims=True), 1e-9))
        delta = delta * scale
        if self.control_mode == "pd_joint_delta_pos":
            arm = self._joint_deltas(base, tcp + delta)
        else:
            limit = float(np.max(base.agent.controller.controllers["arm"].config.pos_upper))
            arm = np.clip(delta / limit, -1.0, 1.0)
            if self.control_mode == "pd_ee_delta_pose":  # no rotation
                arm = np.concatenate([arm, np.zeros_like(arm)], axis=1)
        return np.concatenate([arm, gripper[:, None]], axis=1)

    def _joint_deltas(self, base, target: np.ndarray) -> np.ndarray:
        """Normalised arm joint deltas moving the TCP towards ``target`` (world) with its
        orientation kept: one damped least-squares step of differential IK (a full IK solve from
        the current joints wanders along the 7-joint arm's redundancy and jerks the arm)."""
        arm = base.agent.controller.controllers["arm"]
        kinematics = self._kinematics_of(base, arm)
        qpos = base.agent.robot.get_qpos().detach().cpu().numpy().astype(np.float64)
        to_base = base.agent.robot.pose.inv().to_transformation_matrix().detach().cpu().numpy()
        limit = float(np.max(arm.config.upper))
        rows = []
        for i in range(len(target)):
            q = qpos[i, kinematics.pmodel_active_joint_indices.cpu().numpy()]
            joints = kinematics.pmodel_controlled_joint_indices.cpu().numpy()
            position, jacobian = _tcp_jacobian(kinematics, q, joints)
            wanted = to_base[min(i, len(to_base) - 1)] @ np.append(target[i], 1.0)
            twist = np.concatenate([wanted[:3] - position, np.zeros(3)])
            step = jacobian.T @ np.linalg.solve(jacobian @ jacobian.T + 1e-4 * np.eye(6), twist)
            # scaled as a whole, not clipped per joint: clipping would bend the TCP's path
            rows.append(step / max(limit, float(np.abs(step).max())))
        return np.stack(rows)

    def _kinematics_of(self, base, arm):
        from mani_skill.agents.controllers.utils.kinematics import Kinematics

        if id(base) not in self._kinematics:
            self._kinematics[id(base)] = Kinematics(base.agent.urdf_path, base.agent.tcp.name, base.agent.robot,
                                                    arm.active_joint_indices)
        return self._kinematics[id(base)]


def _tcp_jacobian(kinematics, q: np.ndarray, joints: np.ndarray, eps: float = 1e-6):
    """The TCP's position in the robot's base frame and its ``6 x len(joints)`` Jacobian (linear,
    then angular rows) by finite differences of the arm's forward kinematics: no frame
    conventions to get wrong."""
    model, link = kinematics.pmodel, kinematics.end_link_idx

    def pose(qq):
        model.compute_forward_kinematics(qq)
        matrix = model.get_link_pose(link).to_transformation_matrix()
        return matrix[:3, 3], matrix[:3, :3]

    position, rotation = pose(q)
    jacobian = np.zeros((6, len(joints)))
    for column, joint in enumerate(joints):
        moved = q.copy()
        moved[joint] += eps
        p, r = pose(moved)
        turn = r @ rotation.T  # ~ I + [w]x for a small turn w
        jacobian[:3, column] = (p - position) / eps
        jacobian[3:, column] = 0.5 * np.array([turn[2, 1] - turn[1, 2], turn[0, 2] - turn[2, 0],
                                               turn[1, 0] - turn[0, 1]]) / eps
    return position, jacobian


def build_expert(env_cfg, env) -> ScriptedExpert:
    """The expert of ``env_cfg.task`` acting in ``env_cfg.control_mode``; ``ValueError`` naming
    what is supported otherwise."""
    if env_cfg.task not in TASKS:
        raise ValueError(f"no scripted expert for ManiSkill task '{env_cfg.task}' (env.task); there are "
                         f"experts for: {', '.join(TASKS)}. Use a teacher checkpoint (--source teacher:<folder>)")
    if env_cfg.control_mode not in CONTROL_MODES:
        raise ValueError(f"the scripted expert of '{env_cfg.task}' acts in env.control_mode "
                         f"{' / '.join(CONTROL_MODES)}, not {env_cfg.control_mode!r}: set env.control_mode to one of "
                         "them")
    if env_cfg.control_mode == "pd_joint_delta_pos" and env_cfg.sim_backend != "cpu":
        raise ValueError("the scripted experts solve joint deltas with the CPU backend's kinematic model: set "
                         "env.sim_backend=cpu, or env.control_mode=pd_ee_delta_pos")
    if env_cfg.robot not in ROBOTS:
        raise ValueError(f"the scripted experts drive the panda arm, not env.robot={env_cfg.robot!r}: set "
                         "env.robot=panda (or null)")
    return ScriptedExpert(env, TASKS[env_cfg.task], env_cfg.control_mode)
