"""Simulator adapters behind the batched env protocol; each subpackage registers one env name."""

import os

# MuJoCo picks its OpenGL backend once, when first imported, and ManiSkill imports it early:
# every env family is imported through this package, so render without a display (EGL) unless
# the user chose a backend. The one place this default is set: processes started from one that
# imported this package inherit it, and mujoco's EGL backend sets PYOPENGL_PLATFORM to match.
os.environ.setdefault("MUJOCO_GL", "egl")
