"""Simulator adapters behind the batched env protocol; each subpackage registers one env name."""

import os

# MuJoCo picks its OpenGL backend once, when first imported, and ManiSkill imports it early:
# every env family is imported through this package, so render without a display (EGL) unless
# the user chose a backend.
os.environ.setdefault("MUJOCO_GL", "egl")
