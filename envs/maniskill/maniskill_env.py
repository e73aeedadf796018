"""ManiSkill3 tasks behind the batched env protocol of the env worker.

``ManiSkillEnv`` steps ``B`` sub-environments with action chunks ``[B, C, A]`` and returns
``EnvOutput`` messages with numpy observations (``states``, ``main_images``, optional
``wrist_images``, ``task_descriptions``). Two backends:

- ``"cpu"``: ManiSkill's PhysX CPU sim holds one scene per gym env, so this process owns ``B``
  separate envs, one ``ManiSkillSubEnv`` each, stepped in turn by a ``SerialEnv`` (chunks,
  auto-reset, final observations; parallelism comes from several env worker processes).
- ``"gpu"``: one batched GPU env wrapped in ``ManiSkillVectorEnv``, which auto-resets finished
  sub-envs in place and hands back their final observations.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from embodied_async.contracts import EnvSpec, ResetSeed, SubStep, sub_env_seeds
from embodied_async.data import (
    EnvOutput,
    Observation,
    action_chunks,
    bootstrap_flags,
    final_observations,
)
from embodied_async.evaluation import VIDEO_KEY
from embodied_async.serial_env import SerialEnv

from .configuration_maniskill import ManiSkillConfig
from .gym_make import gym_kwargs, make_task_env
from .rewards import REWARDS
from .tasks import check_task_assets, task_instruction


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _flatten_numeric(tree, batch: int) -> List[np.ndarray]:
    """Leaves of a nested obs dict as float32 ``[B, -1]`` blocks, in sorted key order."""
    if not isinstance(tree, dict):
        return [_to_numpy(tree).reshape(batch, -1).astype(np.float32)]
    return [block for key in sorted(tree) for block in _flatten_numeric(tree[key], batch)]


def privileged_states(base, batch: int) -> np.ndarray:
    """float32 ``[batch, D]``: the vector task ``base`` gives in obs_mode "state" for its current
    sim state, whatever its own obs mode. ManiSkill puts object poses and goals into the extra
    observations only when its obs-mode struct asks for state, so ask for this one call; the
    state mode flattens ``{agent, extra}`` with ``flatten_state_dict`` (insertion order), as here."""
    from mani_skill.utils import common

    struct = base.obs_mode_struct
    saved = struct.state
    struct.state = True
    try:
        tree = base._get_obs_state_dict(base.get_info())
    finally:
        struct.state = saved
    flat = common.flatten_state_dict(tree, use_torch=True, device=base.device)
    return _to_numpy(flat).reshape(batch, -1).astype(np.float32)


def _flag(info: dict, key: str, batch: int) -> np.ndarray:
    value = info.get(key) if isinstance(info, dict) else None
    if value is None:
        return np.zeros(batch, dtype=bool)
    return _to_numpy(value).reshape(batch).astype(bool)


class ManiSkillSubEnv:
    """One gym env of the CPU backend as a ``contracts.SubEnv``: its step's reward (the task's,
    or ``env.reward`` from its info), success, failure and time limit, and its observation."""

    def __init__(self, owner: "ManiSkillEnv", index: int, instruction: str):
        self.owner, self.index, self.env = owner, index, owner._envs[index]
        self.instruction = instruction
        self._raw = None  # the last observation ManiSkill returned

    def reset(self, seed: Optional[int] = None) -> None:
        if self.owner._reward is not None:
            self.owner._reward.reset([self.index])
        self._raw, _ = self.env.reset(seed=seed)

    def step(self, action: np.ndarray) -> SubStep:
        raw, reward, terminated, truncated, info = self.env.step(action)
        self._raw = raw
        if self.owner._reward is not None:
            reward = self.owner._named_reward(info, [self.index], reward)[0]
        return SubStep(reward=float(_to_numpy(reward).reshape(-1)[0]), success=bool(_flag(info, "success", 1)[0]),
                       terminated=bool(_to_numpy(terminated).any()), truncated=bool(_to_numpy(truncated).any()),
                       fail=bool(_flag(info, "fail", 1)[0]))

    def observe(self) -> Observation:
        return self.owner._row(self.index, self._raw)

    def close(self) -> None:
        self.env.close()


class ManiSkillEnv:
    """``num_envs`` ManiSkill sub-environments of one task, stepped with action chunks.

    ``spec`` describes observations and actions for the policy builder. ``reset``/``step`` return
    ``EnvOutput``; finished sub-envs are auto-reset and their last observation is in ``final_obs``.
    """

    def __init__(self, env_cfg: ManiSkillConfig, num_envs: int, seed: int = 0):
        """The config is the checked one (``check()`` ran at start-up): what it checked (modes, task
        ids, robots, rewards) is not checked again here."""
        self.cfg = env_cfg
        self.num_envs = int(num_envs)
        self.task_id = env_cfg.task
        self.obs_mode = env_cfg.obs_mode
        self.backend = env_cfg.sim_backend
        self.terminal_on_success = bool(env_cfg.terminal_on_success)
        # the task of each sub-env: env.tasks spread over them, or the one env.task
        self.sub_env_tasks = list(env_cfg.sub_env_tasks(self.num_envs)) or [self.task_id] * self.num_envs
        self._check_buildable()
        self._reward = None
        if env_cfg.reward is not None:
            self._reward = REWARDS[env_cfg.reward](self.num_envs, dict(env_cfg.reward_weights))
        self._envs: List[Any] = []  # CPU: one gym env per sub-env
        self._vec = None  # GPU: one ManiSkillVectorEnv
        self._robot_copies: Dict[Any, str] = {}  # robot class -> its low-poly URDF
        self._serial: Optional[SerialEnv] = None  # CPU: the sub-envs stepped in turn
        self._obs: Observation = {}  # GPU: current obs of all sub-envs
        self._main_cam: Optional[str] = None
        self._wrist_cam: Optional[str] = None
        base = self._build_envs()
        space = base.single_action_space
        self._low = np.asarray(space.low, dtype=np.float32).reshape(-1)
        self._high = np.asarray(space.high, dtype=np.float32).reshape(-1)
        self.instruction = self._instruction(base)
        if self._vec is None:
            self._serial = self._serial_env()
        self.spec = self._spec(base, seed)
        if self._reward is not None:
            self._check_reward_info(base)

    def _check_buildable(self) -> None:
        """What the config's check cannot see: the sub-env count, the options that need the CPU
        backend where they are set after it (the evaluation's ``render_video``, a collection's
        ``privileged_states``) or not seen by it (``env.tasks``: checked one task at a time), and
        the assets of each task (missing ones are the env's to report, with the download command)."""
        cfg = self.cfg
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if cfg.privileged_states and self.backend != "cpu":
            raise ValueError("env.privileged_states=true needs env.sim_backend=cpu (the GPU vector env resets finished "
                             "sub-envs before their final state can be read)")
        if cfg.tasks and self.backend != "cpu":
            raise ValueError(f"env.tasks={list(cfg.tasks)} needs env.sim_backend=cpu (the GPU backend batches "
                             "one task)")
        if cfg.render_video and self.backend != "cpu":
            raise ValueError("render_video needs sim_backend='cpu' (the GPU vector env resets finished sub-envs "
                             "before their last frame can be rendered)")
        robot_uids = cfg.robot if cfg.robot is not None else (cfg.extra_kwargs or {}).get("robot_uids")
        for task in dict.fromkeys(self.sub_env_tasks):
            check_task_assets(task, robot_uids)

    def _build_envs(self):
        """The simulators: one gym env per sub-env (CPU) or one batched vector env (GPU). Returns
        the (first) task env, whose action space and instruction stand for all."""
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks with gymnasium)

        kwargs = gym_kwargs(self.cfg)
        if self.backend == "cpu":
            for task in self.sub_env_tasks:
                self._envs.append(make_task_env(gym, task, kwargs, 1, self.cfg, self._robot_copies))
            return self._envs[0].unwrapped
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        env = make_task_env(gym, self.task_id, kwargs, self.num_envs, self.cfg, self._robot_copies)
        self._vec = ManiSkillVectorEnv(env, auto_reset=True, ignore_terminations=False)
        return self._vec.base_env

    def _serial_env(self) -> SerialEnv:
        """The CPU backend's sub-envs stepped in turn, each task's instruction read from its first
        sub-env; the tasks of a run share one action space."""
        instructions = {}
        for env, task in zip(self._envs, self.sub_env_tasks):
            instructions.setdefault(task, self._instruction(env.unwrapped, task))
            action_space = env.unwrapped.single_action_space
            if not (np.array_equal(action_space.low.reshape(-1), self._low)
                    and np.array_equal(action_space.high.reshape(-1), self._high)):
                raise ValueError(f"env.tasks: task '{task}' acts in other bounds than '{self.sub_env_tasks[0]}' "
                                 "(the tasks of a run share one action space)")
        subs = [ManiSkillSubEnv(self, i, instructions[task]) for i, task in enumerate(self.sub_env_tasks)]
        return SerialEnv(subs, self._low, self._high, self.terminal_on_success)

    def _spec(self, base, seed: ResetSeed) -> EnvSpec:
        """The spec, from the observation of the first (seeded) reset."""
        return EnvSpec.from_observation(
            self.reset(seed=seed).obs, action_dim=int(self._low.shape[0]),
            num_action_chunks=int(self.cfg.num_action_chunks), action_low=self._low.tolist(),
            action_high=self._high.tolist(), instruction=self.instruction, reports_success=True,
            reports_fail=True, control_hz=float(base.control_freq), tasks=self.cfg.sub_env_tasks(self.num_envs))

    def reset(self, seed: ResetSeed = None) -> EnvOutput:
        """Reset every sub-env (an int: sub-env ``i`` gets ``seed + i``; a list: one seed each, the
        GPU backend's batched reset seeding each sub-env with its own; None continues their RNGs)."""
        if self._serial is not None:
            return self._serial.reset(seed)
        raw, _ = self._vec.reset(seed=sub_env_seeds(seed, self.num_envs))
        self._obs = self._normalise(raw, self.num_envs)
        if self._reward is not None:
            self._reward.reset(range(self.num_envs))
        return EnvOutput.after_reset(self._current_obs(), self.num_envs)

    def step(self, actions: np.ndarray) -> EnvOutput:
        """Execute one action chunk ``[B, C, A]`` (``[B, A]`` is read as ``C = 1``)."""
        if self._serial is not None:
            return self._serial.step(actions)
        actions = action_chunks(actions, self._low, self._high, self.num_envs)
        rewards, dones, bootstrap, successes, finals, executed = self._step_gpu(actions)
        obs = self._current_obs()
        final_obs = final_observations(obs, finals)
        valid = np.ones(self.num_envs, dtype=bool)  # non-finite values are the env worker's job
        return EnvOutput(obs, rewards, dones, bootstrap, successes, valid, final_obs=final_obs, env_steps=executed)

    def reset_envs(self, indices: Sequence[int]) -> Observation:
        """Reset only the sub-envs ``indices``; return the full current observation."""
        if self._serial is not None:
            return self._serial.reset_envs(indices)
        indices = [int(i) for i in np.atleast_1d(np.asarray(indices, dtype=np.int64))]
        if indices:
            import torch

            if self._reward is not None:
                self._reward.reset(indices)
            env_idx = torch.as_tensor(indices, device=self._vec.device)
            raw, _ = self._vec.reset(options=dict(env_idx=env_idx))
            self._obs = self._normalise(raw, self.num_envs)
        return self._current_obs()

    @property
    def task_envs(self) -> List[Any]:
        """The tasks' own (unwrapped) ManiSkill envs: one per sub-env on the CPU backend, one
        batched env on the GPU backend. For code that reads the true sim state (a scripted expert)."""
        return [env.unwrapped for env in self._envs] if self._vec is None else [self._vec.base_env]

    def close(self) -> None:
        """Release the simulators (idempotent)."""
        if self._serial is not None:
            self._serial.close()  # closes the gym envs
        self._envs = []
        if self._vec is not None:
            self._vec.close()
            self._vec = None

    def _blank(self):
        """Zero rewards, False dones/bootstrap/successes and no final observations."""
        flags = [np.zeros(self.num_envs, dtype=bool) for _ in range(3)]
        return (np.zeros(self.num_envs, dtype=np.float32), *flags, {})

    def _step_gpu(self, actions: np.ndarray):
        import torch

        batch, chunks = actions.shape[:2]
        rewards, dones, bootstrap, successes, finals = self._blank()
        executed = np.zeros(batch, dtype=np.int64)  # steps of the episodes being recorded
        for c in range(chunks):
            act = torch.as_tensor(actions[:, c], device=self._vec.device)
            raw, reward, terminated, truncated, info = self._vec.step(act)
            term = _to_numpy(terminated).reshape(batch).astype(bool)
            trunc = _to_numpy(truncated).reshape(batch).astype(bool)
            # Sub-envs that finished earlier in the chunk already run their next episode (the
            # batched sim cannot skip them): their rewards belong to no recorded transition.
            live = ~dones
            executed[live] += 1
            step_info = info.get("final_info", info)  # after auto-reset, info is the reset's
            if self._reward is not None:
                reward = self._named_reward(step_info, range(batch), reward)
                self._reward.reset(np.flatnonzero(term | trunc))
            rewards[live] += _to_numpy(reward).reshape(batch).astype(np.float32)[live]
            successes[live] = _flag(step_info, "success", batch)[live]
            new = live & (term | trunc)
            if new.any():
                last = self._normalise(info["final_observation"], batch)
                for i in np.flatnonzero(new):
                    finals[int(i)] = {k: v[i : i + 1] for k, v in last.items()}
                failed = _flag(step_info, "fail", batch)
                bootstrap[new] = bootstrap_flags(term, trunc, self.terminal_on_success, failed)[new]
                dones |= new
            self._obs = self._normalise(raw, batch)
        return rewards, dones, bootstrap, successes, finals, executed

    def _check_reward_info(self, base) -> None:
        """The named reward reads the task's info: fail at start-up, not at the first step."""
        info = base.get_info()
        missing = [k for k in self._reward.INFO_KEYS if k not in info]
        if missing:
            self.close()
            raise ValueError(f"env.reward={self.cfg.reward!r} needs the info keys {list(self._reward.INFO_KEYS)}, and "
                             f"task '{self.task_id}' reports no {missing}: use it with a task that does (the Bridge "
                             "twins), or set env.reward=null to use the task's own reward (env.reward_mode)")

    def _named_reward(self, info: dict, rows, task_reward) -> np.ndarray:
        """``env.reward`` for sub-envs ``rows`` from this step's ``info`` and the task's own reward
        (their entries in order)."""
        rows = list(rows)
        arrays = {k: _to_numpy(info[k]).reshape(len(rows)) for k in self._reward.INFO_KEYS if k in info}
        arrays["task_reward"] = _to_numpy(task_reward).reshape(len(rows))
        return self._reward.step(arrays, rows)

    def _instruction(self, base, task: Optional[str] = None) -> str:
        if getattr(self.cfg, "instruction", None):
            return self.cfg.instruction
        getter = getattr(base, "get_language_instruction", None)
        if callable(getter):
            try:
                return str(getter()[0])
            except Exception:  # some tasks need a reset first; the table/id words still work
                pass
        return task_instruction(task or self.task_id)

    def _current_obs(self) -> Observation:
        """The GPU backend's observation (the CPU backend's is its serial env's)."""
        obs = dict(self._obs)
        obs["task_descriptions"] = [self.instruction] * self.num_envs
        return obs

    def _row(self, i: int, raw) -> Observation:
        """Sub-env ``i``'s observation (CPU backend), with its video frame when rendering videos."""
        row = self._normalise(raw, 1)
        if self.cfg.privileged_states:
            row["privileged_states"] = privileged_states(self._envs[i].unwrapped, 1)
        if self.cfg.render_video:
            frame = _to_numpy(self._envs[i].unwrapped.render_rgb_array())
            row[VIDEO_KEY] = frame.reshape(1, *frame.shape[-3:])[..., :3].astype(np.uint8)
        return row

    def _normalise(self, raw, batch: int) -> Observation:
        """ManiSkill's raw obs -> ``states`` float32 [b, D] (+ uint8 images in rgb mode)."""
        if self.obs_mode == "state":
            return {"states": np.concatenate(_flatten_numeric(raw, batch), axis=1)}
        parts = [b for key in ("agent", "extra") for b in _flatten_numeric(raw.get(key, {}), batch)]
        out: Observation = {
            "states": np.concatenate(parts, axis=1) if parts else np.zeros((batch, 0), np.float32)
        }
        sensors = raw.get("sensor_data", {})
        if self._main_cam is None:
            cams = [name for name, data in sensors.items() if "rgb" in data]
            if not cams:
                raise ValueError(f"task '{self.task_id}' has no RGB camera for obs_mode {self.obs_mode!r}")
            for key, name in (("env.main_camera", self.cfg.main_camera), ("env.wrist_camera", self.cfg.wrist_camera)):
                if name is not None and name not in cams:
                    raise ValueError(f"{key}={name!r} is not a camera of ManiSkill task '{self.task_id}' with this "
                                     f"robot; its cameras: {', '.join(cams)}")
            # The main view is the first non-hand camera ("base_camera" on most tasks).
            self._main_cam = self.cfg.main_camera or next((n for n in cams if "hand" not in n), cams[0])
            self._wrist_cam = self.cfg.wrist_camera or next(
                (n for n in cams if "hand" in n and n != self._main_cam), None)
        cams = {"main_images": self._main_cam, "wrist_images": self._wrist_cam}
        for key, cam in cams.items():
            if cam is not None:
                out[key] = _to_numpy(sensors[cam]["rgb"])[..., :3].astype(np.uint8)
        return out
