"""embodied_async: asynchronous PPO for robot policies in simulation (framework layer)."""

import os

# MuJoCo picks its OpenGL backend once, when first imported, and other packages import it early
# (ManiSkill does): render without a display (EGL) unless the user chose a backend.
os.environ.setdefault("MUJOCO_GL", "egl")

__version__ = "0.1.0"
