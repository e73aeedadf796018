"""What the tasks of gymnasium-made MuJoCo families (Meta-World, Fetch) share: bounds, cameras
and the model the renderer draws, read from the wrapped env; a seed kept for the next reset."""

from __future__ import annotations

import numpy as np


class GymTask:
    reports_fail = False
    upside_down_cameras = frozenset()

    def __init__(self, env, seed: int):
        self.env = env
        self._seed = int(seed)
        space = env.action_space
        self.action_low, self.action_high = (np.asarray(v, dtype=np.float32) for v in (space.low, space.high))
        model = env.unwrapped.model
        # gymnasium's MuJoCo envs step dt = timestep x frame skip (or substeps) seconds per action
        self.control_hz = 1.0 / float(env.unwrapped.dt)
        self.camera_names = [model.camera(i).name for i in range(model.ncam)]
        self._obs = None

    @property
    def mj_model(self):
        return self.env.unwrapped.model

    @property
    def mj_data(self):
        return self.env.unwrapped.data

    def seed(self, seed: int) -> None:
        self._seed = int(seed)

    def _take_seed(self):
        """The seed given for the next reset (once), else None."""
        seed, self._seed = self._seed, None
        return seed

    def close(self) -> None:
        self.env.close()
