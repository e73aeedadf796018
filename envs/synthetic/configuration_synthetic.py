"""Config of the synthetic image env family (``env.name: synthetic_image``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from embodied_async.config.checks import bound, require
from embodied_async.config.schema import EnvConfig


@dataclass
class SyntheticImageConfig(EnvConfig):
    """Frames of a given resolution showing a target marker and the agent's cursor; the first
    action dimension moves the cursor, and reaching the target is success. Costs next to no CPU,
    so a throughput check measures the policy, not a simulator."""

    name: str = "synthetic_image"
    image_size: List[int] = field(default_factory=lambda: [480, 640])  # [height, width]
    action_dim: int = 7
    max_episode_steps: int = 80
    instruction: str = "move the cursor onto the marker"
    # a test hook for drills of env.on_nonfinite: the first sub-env of every env of this family
    # (each env worker's stage) returns a NaN reward at its k-th step since it was built, counted
    # from 1 (with env.num_action_chunks=1, the env worker's step k of that stage). None: never.
    nan_reward_at_step: Optional[int] = None

    builder: ClassVar[str] = "envs.synthetic.synthetic_env:SyntheticImageEnv"

    def check(self) -> None:
        image_size = list(self.image_size)
        require(len(image_size) == 2 and all(v >= 16 for v in image_size),
                f"env.image_size={image_size} must be [height, width], each >= 16; use e.g. [480, 640]")
        bound(self.action_dim, "env.action_dim", lambda v: v >= 1, "must be >= 1", "use e.g. 7")
        bound(self.max_episode_steps, "env.max_episode_steps", lambda v: v >= 1, "must be >= 1", "use e.g. 80")
        bound(self.nan_reward_at_step, "env.nan_reward_at_step", lambda v: v >= 1, "must be >= 1",
              "it is the step (from 1) whose reward becomes NaN", null="to never give one")

    def check_video(self) -> None:
        """Videos show the camera's frames."""
