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

import contextlib
import difflib
import functools
import inspect
import re
import threading
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

from .configuration_maniskill import OBS_MODES, SIM_BACKENDS, ManiSkillConfig
from .rewards import REWARDS

DOWNLOAD_COMMAND = "python -m mani_skill.utils.download_asset {} -y"

# Hand-written instructions for common tasks (the Bridge twins report their own through
# get_language_instruction); other ids fall back to the words of the id.
INSTRUCTIONS: Dict[str, str] = {
    "PushCube-v1": "push the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "PushT-v1": "push the T-shaped block onto the target T",
    "PullCube-v1": "pull the cube to the goal region",
    "PokeCube-v1": "use the peg to poke the cube to the goal region",
    "LiftPegUpright-v1": "lift the peg upright",
    "PegInsertionSide-v1": "insert the peg into the hole in the side of the box",
    "PlugCharger-v1": "plug the charger into the receptacle",
    "RollBall-v1": "push the ball so that it rolls into the goal region",
    "PlaceSphere-v1": "place the sphere into the bin",
    "PickSingleYCB-v1": "pick up the object and move it to the goal",
}

# ManiSkill's prompt function is a module global; the lock keeps concurrent constructions (the
# "local" cluster backend runs workers as threads) from restoring each other's patch.
_PROMPT_LOCK = threading.Lock()
# The same for the robot's URDF path, a class attribute a low-poly robot copy swaps (_robot_urdf).
_ROBOT_LOCK = threading.RLock()


def task_instruction(task_id: str, instruction: Optional[str] = None) -> str:
    """The language instruction: ``instruction`` if given, the table entry, else the id's words
    (``"TurnFaucet-v1"`` -> ``"turn faucet"``)."""
    if instruction:
        return instruction
    if task_id in INSTRUCTIONS:
        return INSTRUCTIONS[task_id]
    name = re.sub(r"-v\d+$", "", task_id)
    # Split CamelCase keeping acronyms and robot names whole: "UnitreeG1Stand" -> unitree g1 stand.
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+\d*|\d+", name)
    return " ".join(w.lower() for w in words) or task_id


def _missing_asset_path(asset_id: str) -> Optional[str]:
    """Where the asset (a data source or a group of them) belongs when absent; None if present."""
    from mani_skill.utils import assets

    if asset_id in assets.DATA_SOURCES:
        ids = [asset_id]
    elif asset_id in assets.DATA_GROUPS:
        ids = assets.expand_data_group_into_individual_data_source_ids(asset_id)
    else:
        return None  # not a downloadable id: nothing to check
    absent = [assets.DATA_SOURCES[i] for i in ids if not assets.is_data_source_downloaded(i)]
    if not absent:
        return None
    # A group (e.g. hundreds of PartNet models) is named by the folder its sources share.
    first = absent[0]
    return str(first.output_dir / first.target_path if len(ids) == 1 else first.output_dir)


def check_task_assets(task_id: str, robot_uids: Any = None) -> None:
    """Fail fast, without prompting or downloading, when ``task_id`` cannot be built here.

    Raises ``ValueError`` for an unknown id (with close matches from ManiSkill's registry) and
    ``FileNotFoundError`` naming the download command when the task's or its robot's assets are
    missing. ManiSkill itself would ask "download now? (y|n)" on stdin, which hangs a worker.
    """
    import mani_skill.envs  # noqa: F401  (importing registers every task)
    from mani_skill.agents.registration import REGISTERED_AGENTS
    from mani_skill.utils.registration import REGISTERED_ENVS

    if task_id not in REGISTERED_ENVS:
        close = difflib.get_close_matches(task_id, list(REGISTERED_ENVS), n=5, cutoff=0.4)
        hint = ", ".join(close) if close else ", ".join(sorted(REGISTERED_ENVS)[:8]) + ", ..."
        raise ValueError(f"unknown ManiSkill task id '{task_id}' (env.task_id); close: {hint}")
    spec = REGISTERED_ENVS[task_id]
    asset_ids = list(spec.asset_download_ids or [])
    if robot_uids is None:
        # The task's default robot, when its constructor names one (e.g. robot_uids="panda").
        param = inspect.signature(spec.cls.__init__).parameters.get("robot_uids")
        robot_uids = None if param is None else param.default
    robots = robot_uids if isinstance(robot_uids, (list, tuple)) else [robot_uids]
    for uid in robots:
        if isinstance(uid, str) and uid in REGISTERED_AGENTS:
            asset_ids += REGISTERED_AGENTS[uid].asset_download_ids or []
    paths = {a: _missing_asset_path(a) for a in dict.fromkeys(asset_ids)}
    missing = [a for a, path in paths.items() if path is not None]
    if missing:
        where = "; ".join(f"{a} (expected at {paths[a]})" for a in missing)
        commands = "\n".join("  " + DOWNLOAD_COMMAND.format(a) for a in missing)
        raise FileNotFoundError(
            f"ManiSkill task '{task_id}' needs assets that are not downloaded: {where}. "
            f"Download them with:\n{commands}\n(set MS_ASSET_DIR to keep them elsewhere)"
        )


def check_task_modes(task_id: str, obs_mode: str, reward_mode: str) -> None:
    """``ValueError`` naming the supported modes when the task cannot run with these, read from
    the task class before any scene is built (so it works without the task's assets).

    ManiSkill would raise ``NotImplementedError`` only inside the env's constructor. Tasks that
    declare "any_textures" accept any image mode (rgb, rgb+segmentation, ...)."""
    import mani_skill.envs  # noqa: F401  (importing registers every task)
    from mani_skill.utils.registration import REGISTERED_ENVS

    task = REGISTERED_ENVS[task_id].cls
    obs_modes = tuple(task.SUPPORTED_OBS_MODES)
    textures = obs_mode != "state" and "any_textures" in obs_modes
    if obs_mode not in obs_modes and not textures:
        usable = [m for m in obs_modes if m in OBS_MODES]
        if "any_textures" in obs_modes:
            usable += ["rgb", "rgb+segmentation"]
        raise ValueError(f"ManiSkill task '{task_id}' does not support env.obs_mode={obs_mode!r}: it supports "
                         f"{list(obs_modes)}. Set env.obs_mode to one of {sorted(set(usable))}")
    reward_modes = tuple(task.SUPPORTED_REWARD_MODES)
    if reward_mode not in reward_modes:
        hint = " (it pays no reward itself: set env.reward to a named reward such as 'grasp_place')" \
            if reward_modes == ("none",) else ""
        raise ValueError(f"ManiSkill task '{task_id}' does not support env.reward_mode={reward_mode!r}: it supports "
                         f"{list(reward_modes)}. Set env.reward_mode to one of them{hint}")


def check_task_robot(task_id: str, robot_uids: Optional[str]) -> None:
    """``ValueError`` listing the task's robots when ``robot_uids`` is not one of them."""
    if robot_uids is None:
        return
    import mani_skill.envs  # noqa: F401  (importing registers every task)
    from mani_skill.utils.registration import REGISTERED_ENVS

    supported = list(getattr(REGISTERED_ENVS[task_id].cls, "SUPPORTED_ROBOTS", None) or [])
    names = [r if isinstance(r, str) else "+".join(r) for r in supported]
    if supported and robot_uids not in names:
        raise ValueError(f"env.robot_uids={robot_uids!r} is not a robot of ManiSkill task '{task_id}'; it supports: "
                         f"{', '.join(names)}")


@contextlib.contextmanager
def _control_mode_named(env_cfg):
    """ManiSkill asserts on a control mode the robot lacks: say which key and which modes."""
    try:
        yield
    except AssertionError as err:
        if "not in supported modes" not in str(err):
            raise
        robot = env_cfg.robot_uids or "the task's default robot"
        raise ValueError(f"env.control_mode={env_cfg.control_mode!r} is not a control mode of {robot} in ManiSkill "
                         f"task '{env_cfg.task_id}': {err}. Set env.control_mode to one of them") from None


@contextlib.contextmanager
def _refuse_download_prompts(task_id: str):
    """Turn a download prompt ManiSkill still reaches (robots chosen inside a task's constructor,
    which ``check_task_assets`` cannot see) into an error instead of ``input()`` / ``exit()``."""
    from mani_skill.utils import download_asset

    def refuse(message: str):
        match = re.search(r"Robot (\S+) has assets", message)
        uid = match.group(1) if match else task_id
        raise FileNotFoundError(
            f"ManiSkill task '{task_id}' needs assets that are not downloaded ({message.strip()}). "
            f"Download them with:\n  {DOWNLOAD_COMMAND.format(uid)}"
        )

    with _PROMPT_LOCK:
        original = download_asset.prompt_yes_no
        download_asset.prompt_yes_no = refuse
        try:
            yield
        finally:
            download_asset.prompt_yes_no = original


def _task_robot_class(task_id: str, robot_uids: Optional[str]):
    """The agent class ManiSkill builds for ``task_id`` with ``robot_uids`` (null: the task's
    default, the ``robot_uids`` default of its constructor)."""
    from mani_skill.agents.registration import REGISTERED_AGENTS
    from mani_skill.utils.registration import REGISTERED_ENVS

    uid = robot_uids
    if uid is None:
        default = inspect.signature(REGISTERED_ENVS[task_id].cls.__init__).parameters.get("robot_uids")
        uid = None if default is None else default.default
    if not isinstance(uid, str) or uid not in REGISTERED_AGENTS:
        raise ValueError(f"env.robot_mesh_fraction < 1 needs one robot by name; ManiSkill task '{task_id}' uses "
                         f"{uid!r}: set env.robot_uids, or env.robot_mesh_fraction=1.0")
    agent_cls = REGISTERED_AGENTS[uid].agent_cls
    if getattr(agent_cls, "urdf_path", None) is None:
        raise ValueError(f"env.robot_mesh_fraction < 1 reduces a URDF robot's meshes; '{uid}' has no URDF: set "
                         "env.robot_mesh_fraction=1.0")
    return agent_cls


@contextlib.contextmanager
def _robot_urdf(agent_cls, urdf_path: Optional[str]):
    """ManiSkill reads the robot's URDF from its agent class when it builds a scene: point the
    class at ``urdf_path`` (None: leave it) for as long as the scene is built."""
    with _ROBOT_LOCK:  # the attribute is shared by every env of this process: build one at a time
        if urdf_path is None:
            yield
            return
        original = agent_cls.urdf_path
        agent_cls.urdf_path = urdf_path
        try:
            yield
        finally:
            agent_cls.urdf_path = original


def _build_robot_from(base, agent_cls, urdf_path: Optional[str]) -> None:
    """Later scene rebuilds (a reset with reconfiguration) load the same robot copy."""
    if urdf_path is None:
        return
    load_agent = base._load_agent

    def load_agent_from_copy(*args, **kwargs):
        with _robot_urdf(agent_cls, urdf_path):
            return load_agent(*args, **kwargs)

    base._load_agent = load_agent_from_copy


@functools.lru_cache(maxsize=1)
def _render_backend() -> str:
    """"gpu" when SAPIEN sees a CUDA device, else "cpu" (saves ManiSkill's fall-back warning)."""
    import sapien

    try:
        sapien.Device("cuda")
        return "gpu"
    except RuntimeError:
        return "cpu"


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
        self.cfg = env_cfg
        self.num_envs = int(num_envs)
        self.task_id = env_cfg.task_id
        self.obs_mode = env_cfg.obs_mode
        self.backend = env_cfg.sim_backend
        self.terminal_on_success = bool(env_cfg.terminal_on_success)
        if self.obs_mode not in OBS_MODES:
            raise ValueError(f"env.obs_mode must be one of {OBS_MODES}, got '{self.obs_mode}'")
        if self.backend not in SIM_BACKENDS:
            raise ValueError(f"env.sim_backend must be one of {SIM_BACKENDS}, got '{self.backend}'")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if env_cfg.privileged_states and self.backend != "cpu":
            raise ValueError("env.privileged_states=true needs env.sim_backend=cpu (the GPU vector env resets finished "
                             "sub-envs before their final state can be read)")
        extra = dict(getattr(env_cfg, "extra_kwargs", None) or {})
        if env_cfg.robot_uids is not None:
            extra["robot_uids"] = env_cfg.robot_uids
        # the task of each sub-env: env.tasks spread over them, or the one env.task_id
        self.sub_env_tasks = list(env_cfg.sub_env_tasks(self.num_envs)) or [self.task_id] * self.num_envs
        if env_cfg.tasks and self.backend != "cpu":
            raise ValueError(f"env.tasks={list(env_cfg.tasks)} needs env.sim_backend=cpu (the GPU backend batches "
                             "one task)")
        for task in dict.fromkeys(self.sub_env_tasks):
            check_task_assets(task, extra.get("robot_uids"))
            check_task_modes(task, self.obs_mode, env_cfg.reward_mode)
            check_task_robot(task, env_cfg.robot_uids)
        self._reward = None
        if env_cfg.reward is not None:
            self._reward = REWARDS[env_cfg.reward](self.num_envs, dict(env_cfg.reward_weights))

        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks with gymnasium)

        kwargs: Dict[str, Any] = dict(
            obs_mode=self.obs_mode,
            reward_mode=env_cfg.reward_mode,
            render_mode=None,
            sim_backend=self.backend,
            render_backend="gpu" if self.backend == "gpu" else _render_backend(),
        )
        if self.backend == "cpu":
            # an auto-reset episode then starts from the sub-env's own seeded RNG, not from the
            # process's global torch RNG (which the policy's sampling also draws from): a run's
            # training episodes follow from its seed, and an evaluation reset with one seed
            # replays the same episodes in any process
            kwargs["enhanced_determinism"] = True
        if env_cfg.control_mode:
            kwargs["control_mode"] = env_cfg.control_mode
        if env_cfg.max_episode_steps:
            kwargs["max_episode_steps"] = int(env_cfg.max_episode_steps)
        if env_cfg.render_video:
            if self.backend != "cpu":
                raise ValueError("render_video needs sim_backend='cpu' (the GPU vector env resets finished sub-envs "
                                 "before their last frame can be rendered)")
            height, width = (int(v) for v in env_cfg.video_size)
            kwargs["human_render_camera_configs"] = dict(width=width, height=height)
        if self.obs_mode != "state":
            height, width = (int(v) for v in env_cfg.image_size)
            sensors = dict(width=width, height=height)
            sensors.update(extra.pop("sensor_configs", None) or {})
            kwargs["sensor_configs"] = sensors
        kwargs.update(extra)

        self._envs: List[Any] = []  # CPU: one gym env per sub-env
        self._vec = None  # GPU: one ManiSkillVectorEnv
        self._robot_copies: Dict[Any, str] = {}  # robot class -> its low-poly URDF
        if self.backend == "cpu":
            for task in self.sub_env_tasks:
                self._envs.append(self._make(gym, task, kwargs, 1))
        else:
            from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

            self._vec = ManiSkillVectorEnv(self._make(gym, self.task_id, kwargs, self.num_envs), auto_reset=True,
                                           ignore_terminations=False)
        base = self._envs[0].unwrapped if self._envs else self._vec.base_env
        space = base.single_action_space
        self._low = np.asarray(space.low, dtype=np.float32).reshape(-1)
        self._high = np.asarray(space.high, dtype=np.float32).reshape(-1)
        self.instruction = self._instruction(base)
        self._serial: Optional[SerialEnv] = None  # CPU: the sub-envs stepped in turn
        if self._vec is None:
            instructions = {}  # per task, read from its first sub-env
            for env, task in zip(self._envs, self.sub_env_tasks):
                instructions.setdefault(task, self._instruction(env.unwrapped, task))
                action_space = env.unwrapped.single_action_space
                if not (np.array_equal(action_space.low.reshape(-1), self._low)
                        and np.array_equal(action_space.high.reshape(-1), self._high)):
                    raise ValueError(f"env.tasks: task '{task}' acts in other bounds than '{self.sub_env_tasks[0]}' "
                                     "(the tasks of a run share one action space)")
            subs = [ManiSkillSubEnv(self, i, instructions[task]) for i, task in enumerate(self.sub_env_tasks)]
            self._serial = SerialEnv(subs, self._low, self._high, self.terminal_on_success)
        self._obs: Observation = {}  # GPU: current obs of all sub-envs
        self._main_cam: Optional[str] = None
        self._wrist_cam: Optional[str] = None
        self.spec = EnvSpec.from_observation(
            self.reset(seed=seed).obs, action_dim=int(self._low.shape[0]),
            num_action_chunks=int(env_cfg.num_action_chunks), action_low=self._low.tolist(),
            action_high=self._high.tolist(), instruction=self.instruction, reports_success=True,
            reports_fail=True, control_hz=float(base.control_freq), tasks=env_cfg.sub_env_tasks(self.num_envs))
        if self._reward is not None:
            self._check_reward_info(base)

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

    def _make(self, gym, task: str, kwargs: Dict[str, Any], num_envs: int):
        """``gym.make`` of ``task`` with ``num_envs`` scenes, its robot the low-poly copy when
        ``env.robot_mesh_fraction`` < 1."""
        agent_cls, robot_copy = None, None
        if float(self.cfg.robot_mesh_fraction) < 1.0:
            from .low_poly import low_poly_urdf

            agent_cls = _task_robot_class(task, self.cfg.robot_uids)
            if agent_cls not in self._robot_copies:
                self._robot_copies[agent_cls] = str(low_poly_urdf(agent_cls.urdf_path,
                                                                  float(self.cfg.robot_mesh_fraction)))
            robot_copy = self._robot_copies[agent_cls]
        with _refuse_download_prompts(task), _control_mode_named(self.cfg), _robot_urdf(agent_cls, robot_copy):
            env = gym.make(task, num_envs=num_envs, **kwargs)
            _build_robot_from(env.unwrapped, agent_cls, robot_copy)
        return env

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
