"""MuJoCo env families: robosuite, Meta-World and gymnasium-robotics' Fetch tasks, behind one
batched env (``mujoco_env.MujocoEnv``). ``configuration_mujoco`` holds their configs; importing
this package imports no simulator.

MuJoCo chooses its OpenGL backend when it is first imported: EGL (rendering without a display)
unless the caller chose one, set here, before any of these modules imports a simulator."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
