"""The LIBERO family's config: a suite, a task of it (or several: ``env.tasks``), the cameras and
the episode rules of the published evaluations. Checked at start-up by asking the family's own
environment (LIBERO is never imported in our venv)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional

from omegaconf import MISSING

from embodied_async.config.checks import ConfigError, bound, choice, require
from embodied_async.config.schema import EnvConfig

# the step limits of the published LIBERO evaluations (OpenVLA's and openpi's evaluation scripts)
SUITE_STEP_LIMITS: Dict[str, int] = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
                                     "libero_10": 520, "libero_90": 400}
OTHER_SUITES_STEP_LIMIT = 400
GRIPPERS = ("libero", "open_one")
ALL_TASKS = "all"  # env.tasks=[all]: every task of the suite
CHILD = "envs.libero.libero_child"
NO_CAMERA = "none"


@functools.lru_cache(maxsize=None)
def describe_suite(suite: str) -> Dict[str, object]:
    """The suites, ``suite``'s tasks, the scenes' cameras and each task's number of initial states,
    asked of LIBERO in the family's own environment (a second or two; once per suite and process)."""
    from embodied_async.isolated.child import query

    return query("libero", LiberoConfig.python_env, f"{CHILD}:describe", {"suite": suite})


@dataclass
class LiberoConfig(EnvConfig):
    """A LIBERO task (https://libero-project.github.io): the robot's end-effector deltas and gripper
    (7 values in [-1, 1], the gripper's -1 open, +1 closed, as LIBERO's scripts send them), the
    agent-view and wrist cameras, success from the task's goal predicates (a sparse reward)."""

    name: str = "libero"
    # libero_spatial, libero_object, libero_goal, libero_10, libero_90 (and LIBERO-PRO's perturbed
    # suites, e.g. libero_spatial_swap)
    suite: str = "libero_spatial"
    task: str = MISSING  # a task of the suite, by its name (e.g. pick_up_the_black_bowl_..._on_the_plate)
    image_size: List[int] = field(default_factory=lambda: [128, 128])  # [height, width] of each camera
    main_camera: str = "agentview"
    wrist_camera: str = "robot0_eye_in_hand"  # "none": no wrist images
    # null: the suite's limit in the published evaluations (SUITE_STEP_LIMITS; a LIBERO-PRO suite
    # takes the limit of the suite it perturbs, others 400)
    max_episode_steps: Optional[int] = None
    # the gripper value (the action's last) a policy sends: "libero" -1 open, +1 closed (LIBERO's
    # demonstrations and the hub datasets); "open_one" 1 open, 0 closed (OpenVLA's LIBERO checkpoints,
    # trained on data with the gripper flipped), turned into LIBERO's at 0.5 as OpenVLA's evaluation does
    gripper: str = "libero"
    # false: the mirror reflections of the table and floor are not rendered, for CPU runs: 1.6x
    # the frames per second at 128x128 here (benchmarks/libero_env_speed.py); the images then
    # differ from the published renders (no reflections), which a policy trained on those sees
    # as a shift
    reflections: bool = True
    # below 1: the scene's visual meshes (not those of collisions: the physics is the same) keep
    # this fraction of their triangles, for CPU runs (envs/libero/low_poly_scene.py; built once
    # into a cache folder). 0.25: 2.3x the frames per second at 128x128 here, 3.2x with no
    # reflections; coarser outlines and blurred texture seams (a plate's rim, the stove's rings)
    mesh_fraction: float = 1.0
    # null: each task's sub-envs go through its official initial states in order (episode i from
    # state i, the published protocol); an index: every episode starts from that state
    init_state: Optional[int] = None
    # no-op steps after each reset while the objects settle, not counted (the published evaluations wait 10)
    settle_steps: int = 10

    builder: ClassVar[str] = "envs.libero.libero_env:build_libero_env"
    task_key: ClassVar[Optional[str]] = "task"  # env.tasks: several tasks of the suite
    python_env: ClassVar[Optional[str]] = "libero"
    supports_privileged_states: ClassVar[bool] = True  # the scene's object state and the robot's

    def __post_init__(self) -> None:
        if list(self.tasks) == [ALL_TASKS]:
            try:
                self.tasks = list(describe_suite(self.suite)["tasks"])
            except (RuntimeError, FileNotFoundError) as err:
                raise ConfigError(f"env ({self.name}): {err}") from None

    def step_limit(self) -> int:
        """The published limit of the suite, or of the suite a LIBERO-PRO suite perturbs
        (libero_spatial_swap: libero_spatial's)."""
        if self.max_episode_steps:
            return int(self.max_episode_steps)
        matches = [suite for suite in SUITE_STEP_LIMITS if self.suite == suite or self.suite.startswith(f"{suite}_")]
        return SUITE_STEP_LIMITS[max(matches, key=len)] if matches else OTHER_SUITES_STEP_LIMIT

    def cameras(self) -> Dict[str, Optional[str]]:
        return {"main_images": self.main_camera,
                "wrist_images": None if self.wrist_camera == NO_CAMERA else self.wrist_camera}

    def child_config(self) -> Dict[str, object]:
        """What the child builds its simulator from (plain data)."""
        return {"suite": self.suite, "task": self.task, "image_size": list(self.image_size),
                "cameras": self.cameras(), "step_limit": self.step_limit(), "settle_steps": self.settle_steps,
                "init_state": self.init_state, "gripper": self.gripper,
                "reflections": self.reflections, "mesh_fraction": self.mesh_fraction,
                "privileged_states": self.privileged_states, "render_video": self.render_video,
                "video_size": list(self.video_size)}

    def check(self) -> None:
        image_size = list(self.image_size)
        require(len(image_size) == 2 and all(int(v) >= 8 for v in image_size),
                f"env.image_size={image_size} must be [height, width], each >= 8; use e.g. [128, 128]")
        bound(self.max_episode_steps, "env.max_episode_steps", lambda v: v >= 1, "must be >= 1",
              "use e.g. 220", null="for the suite's limit")
        choice(self.gripper, "env.gripper", GRIPPERS)
        bound(self.mesh_fraction, "env.mesh_fraction", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]",
              "use 1.0 for the published scenes, or e.g. 0.1 for cheaper frames on a CPU")
        bound(self.settle_steps, "env.settle_steps", lambda v: v >= 0, "must be >= 0", "use 10, as published")
        try:
            known = describe_suite(self.suite)
        except (RuntimeError, FileNotFoundError) as err:
            raise ConfigError(f"env ({self.name}): {err}") from None
        require(self.suite in known["suites"],
                f"env.suite={self.suite!r} is not a LIBERO suite; the suites: {', '.join(known['suites'])}")
        require(self.task in known["tasks"], f"env.task={self.task!r} is not a task of {self.suite}; its tasks: "
                                             f"{', '.join(known['tasks'])}")
        count = known["init_states"][self.task]
        require(self.init_state is None or 0 <= int(self.init_state) < count,
                f"env.init_state={self.init_state} is out of range: {self.task} has {count} initial states, 0 to "
                f"{count - 1}; or null to go through them all")
        for key, camera in (("env.main_camera", self.main_camera), ("env.wrist_camera", self.wrist_camera)):
            require(camera in (*known["cameras"], *([NO_CAMERA] if key == "env.wrist_camera" else [])),
                    f"{key}={camera!r} is not a camera of LIBERO's scenes; the cameras: {', '.join(known['cameras'])}")
