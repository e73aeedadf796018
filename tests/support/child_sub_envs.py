"""Simulators for the child-process tests (``embodied_async.isolated``): built in the child from
a plain config, numpy only."""

import os
import time

import numpy as np

from embodied_async.contracts import SubStep


class CountingSubEnv:
    """A position that moves by the action; success at ``goal``, a time limit of ``horizon`` steps;
    ``die_at``: the process ends (as a crash would) at that step of an episode; ``step_log``: a
    file each step appends its start and end (wall clock) to, after ``step_sleep_s`` of work."""

    def __init__(self, config):
        self.goal, self.horizon, self.die_at = config["goal"], config["horizon"], config.get("die_at")
        self.step_log, self.step_sleep_s = config.get("step_log"), config.get("step_sleep_s", 0.0)
        self.instruction = f"count to {self.goal}"
        self.rng = np.random.default_rng(0)
        self.position, self.steps, self.start = 0.0, 0, 0.0

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.start = float(self.rng.integers(0, 3))  # the episode's initial state, from the seed
        self.position, self.steps = self.start, 0

    def step(self, action):
        began = time.time()
        time.sleep(self.step_sleep_s)
        if self.step_log:
            with open(self.step_log, "a") as f:
                f.write(f"{began} {time.time()}\n")
        self.steps += 1
        if self.die_at is not None and self.steps >= self.die_at:
            os._exit(7)
        print("a simulator that prints must not corrupt the pipe")
        self.position += float(action[0])
        success = self.position >= self.goal
        return SubStep(reward=float(success), success=bool(success), terminated=bool(success),
                       truncated=not success and self.steps >= self.horizon)

    def observe(self):
        return {"states": np.array([[self.position, self.start]], dtype=np.float32),
                "main_images": np.full((1, 4, 4, 3), self.steps, dtype=np.uint8)}

    def close(self):
        pass


def build_counting(config):
    return CountingSubEnv(config)


def build_refusing(config):
    raise ValueError(f"no task {config['task']!r}; the tasks: a, b")
