"""LIBERO's speed on this machine, per process, through the path a run takes (a LIBERO simulator in
a child process under .venv-libero, reached over its pipe): env steps per second (a step and its
observation) for one task's scene without cameras, with the agent-view camera, with both cameras,
at several sizes, with the reflections off (``env.reflections=false``) and with fewer mesh
triangles (``env.mesh_fraction``), and the seconds a reset takes (LIBERO rebuilds its scene at
every reset; the second reset is timed, after the reduced meshes were cached).

    .venv/bin/python benchmarks/libero_env_speed.py [--steps 60] [--suite libero_spatial]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from embodied_async.isolated.child import ChildSubEnv
from envs.libero.configuration_libero import CHILD, LiberoConfig

AGENT_VIEW = {"main_images": "agentview"}
BOTH = {"main_images": "agentview", "wrist_images": "robot0_eye_in_hand"}
# (name, cameras, size, reflections, mesh fraction)
CASES = [("no cameras", {}, 128, True, 1.0), ("agent view 64x64", AGENT_VIEW, 64, True, 1.0),
         ("agent view 128x128", AGENT_VIEW, 128, True, 1.0), ("agent view 256x256", AGENT_VIEW, 256, True, 1.0),
         ("agent view + wrist 128x128", BOTH, 128, True, 1.0), ("agent view + wrist 256x256", BOTH, 256, True, 1.0),
         ("agent view 128x128, no reflections", AGENT_VIEW, 128, False, 1.0),
         ("agent view 128x128, meshes 0.25", AGENT_VIEW, 128, True, 0.25),
         ("agent view 128x128, no reflections, meshes 0.25", AGENT_VIEW, 128, False, 0.25),
         ("agent view 128x128, no reflections, meshes 0.1", AGENT_VIEW, 128, False, 0.1),
         ("agent view + wrist 256x256, no reflections", BOTH, 256, False, 1.0),
         ("agent view + wrist 256x256, no reflections, meshes 0.25", BOTH, 256, False, 0.25)]


def measure(suite: str, task: str, cameras, size: int, reflections: bool, fraction: float, steps: int) -> tuple:
    settings = {"suite": suite, "task": task, "image_size": [size, size], "cameras": cameras, "step_limit": 10**6,
                "settle_steps": 0, "privileged_states": False, "render_video": False, "video_size": [size, size],
                "init_state": None, "place": 0, "count": 1, "gripper": "libero", "reflections": reflections,
                "mesh_fraction": fraction}
    sub = ChildSubEnv("libero", LiberoConfig.python_env, f"{CHILD}:build_sub_env", settings)
    try:
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        sub.reset(0)  # the scene as configured is built at the first reset
        reset_s = time.perf_counter() - started
        started = time.perf_counter()
        sub.reset(1)
        reset_s = time.perf_counter() - started
        sub.observe()
        for _ in range(3):  # warm-up
            sub.step(rng.uniform(-1, 1, 7))
            sub.observe()
        started = time.perf_counter()
        for _ in range(steps):
            sub.step(rng.uniform(-1, 1, 7))
            sub.observe()
        return steps / (time.perf_counter() - started), reset_s
    finally:
        sub.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", default=None, help="a task of the suite (default: its first)")
    args = parser.parse_args()
    from envs.libero.configuration_libero import describe_suite

    task = args.task or describe_suite(args.suite)["tasks"][0]
    print(f"[libero speed] {args.suite} / {task}: {args.steps} steps per case, one process", flush=True)
    for name, cameras, size, reflections, fraction in CASES:
        rate, reset_s = measure(args.suite, task, cameras, size, reflections, fraction, args.steps)
        print(f"{name:45s} {rate:6.1f} env steps/s   reset {reset_s:4.1f} s", flush=True)


if __name__ == "__main__":
    main()
