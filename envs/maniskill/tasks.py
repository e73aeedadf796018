"""ManiSkill tasks as read from ManiSkill's registry, before any scene is built: the checks of a task
id, its assets, its observation and reward modes and its robots, and its language instruction.

The config's start-up check (``configuration_maniskill``) and the env (``maniskill_env``) both use
these; ManiSkill itself is imported on the first check, not with this module.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any, Dict, Optional

# "rgb+segmentation": rgb images (the segmentation is only used inside the task, e.g. by the
# Bridge twins' green screen that pastes the real scene behind the simulated objects)
OBS_MODES = ("state", "rgb", "rgb+segmentation")
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


def _task_class(task_id: str):
    """The registered task class of ``task_id`` (importing ``mani_skill.envs`` registers every task)."""
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils.registration import REGISTERED_ENVS

    return REGISTERED_ENVS[task_id].cls


def _default_robot(task_id: str) -> Any:
    """The robot the task builds when ``robot_uids`` is not given: its constructor's default
    (e.g. ``"panda"``), None when the constructor takes none."""
    param = inspect.signature(_task_class(task_id).__init__).parameters.get("robot_uids")
    return None if param is None else param.default


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


def _check_task_id(task_id: str) -> None:
    """``ValueError`` with close matches from ManiSkill's registry for an unknown id."""
    import mani_skill.envs  # noqa: F401  (importing registers every task)
    from mani_skill.utils.registration import REGISTERED_ENVS

    if task_id not in REGISTERED_ENVS:
        close = difflib.get_close_matches(task_id, list(REGISTERED_ENVS), n=5, cutoff=0.4)
        hint = ", ".join(close) if close else ", ".join(sorted(REGISTERED_ENVS)[:8]) + ", ..."
        raise ValueError(f"unknown ManiSkill task id '{task_id}' (env.task_id); close: {hint}")


def check_task_assets(task_id: str, robot_uids: Any = None) -> None:
    """Fail fast, without prompting or downloading, when ``task_id`` cannot be built here.

    Raises ``ValueError`` for an unknown id (with close matches from ManiSkill's registry) and
    ``FileNotFoundError`` naming the download command when the task's or its robot's assets are
    missing. ManiSkill itself would ask "download now? (y|n)" on stdin, which hangs a worker.
    """
    from mani_skill.agents.registration import REGISTERED_AGENTS
    from mani_skill.utils.registration import REGISTERED_ENVS

    _check_task_id(task_id)
    asset_ids = list(REGISTERED_ENVS[task_id].asset_download_ids or [])
    if robot_uids is None:
        robot_uids = _default_robot(task_id)
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
    task = _task_class(task_id)
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
    supported = list(getattr(_task_class(task_id), "SUPPORTED_ROBOTS", None) or [])
    names = [r if isinstance(r, str) else "+".join(r) for r in supported]
    if supported and robot_uids not in names:
        raise ValueError(f"env.robot={robot_uids!r} is not a robot of ManiSkill task '{task_id}'; it supports: "
                         f"{', '.join(names)}")


def task_robot_class(task_id: str, robot_uids: Optional[str]):
    """The agent class ManiSkill builds for ``task_id`` with ``robot_uids`` (null: the task's
    default), for ``env.robot_mesh_fraction`` < 1: ``ValueError`` unless it is one URDF robot."""
    from mani_skill.agents.registration import REGISTERED_AGENTS

    uid = _default_robot(task_id) if robot_uids is None else robot_uids
    if not isinstance(uid, str) or uid not in REGISTERED_AGENTS:
        raise ValueError(f"env.robot_mesh_fraction < 1 needs one robot by name; ManiSkill task '{task_id}' uses "
                         f"{uid!r}: set env.robot, or env.robot_mesh_fraction=1.0")
    agent_cls = REGISTERED_AGENTS[uid].agent_cls
    if getattr(agent_cls, "urdf_path", None) is None:
        raise ValueError(f"env.robot_mesh_fraction < 1 reduces a URDF robot's meshes; '{uid}' has no URDF: set "
                         "env.robot_mesh_fraction=1.0")
    return agent_cls
