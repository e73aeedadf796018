"""MuJoCo env families: robosuite, Meta-World and gymnasium-robotics' Fetch tasks, behind one
batched env (``mujoco_env.MujocoEnv``). ``configuration_mujoco`` holds their configs; importing
this package imports no simulator.
(``envs/__init__.py`` chooses MuJoCo's EGL backend before any simulator is imported.)"""
