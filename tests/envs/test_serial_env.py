"""SerialEnv: the chunk, auto-reset and final-observation loop every serial env family shares."""

import numpy as np

from embodied_async.contracts import Env, SubEnv, SubStep
from embodied_async.serial_env import SerialEnv
from embodied_async.workers.env_worker import EpisodeStats


class Countdown:
    """An episode of ``length`` steps; reward = the action's first value; the observation counts
    the steps taken in the episode, and ``episodes`` those begun."""

    def __init__(self, length: int, instruction: str, success: bool = True):
        self.length, self.instruction, self.success = length, instruction, success
        self.steps, self.episodes, self.seeds = 0, 0, []

    def reset(self, seed=None):
        self.seeds.append(seed)
        self.steps, self.episodes = 0, self.episodes + 1

    def step(self, action):
        self.steps += 1
        done = self.steps >= self.length
        return SubStep(reward=float(action[0]), success=done and self.success, terminated=done and self.success,
                       truncated=done and not self.success)

    def observe(self):
        return {"states": np.array([[self.steps, self.episodes]], dtype=np.float32)}

    def close(self):
        pass


def make(terminal_on_success=True):
    subs = [Countdown(2, "push the cube"), Countdown(9, "pull the cube", success=False)]
    return SerialEnv(subs, [-1.0], [1.0], terminal_on_success), subs


def test_a_chunk_stops_where_its_episode_ends_and_counts_the_steps_executed():
    env, subs = make()
    assert all(isinstance(sub, SubEnv) for sub in subs) and not isinstance(env, Env)  # Env also needs a spec
    out = env.reset(seed=10)
    assert [sub.seeds for sub in subs] == [[10], [11]]  # sub-env i: seed + i
    assert out.env_steps.tolist() == [0, 0] and out.obs["task_descriptions"] == ["push the cube", "pull the cube"]
    actions = np.full((2, 4, 1), 0.5, np.float32)
    actions[0, 2:] = 2.0  # would be paid if the finished episode's plan went on
    out = env.step(actions)
    assert out.env_steps.tolist() == [2, 4]
    assert out.rewards.tolist() == [1.0, 2.0]
    assert out.dones.tolist() == [True, False] and out.successes.tolist() == [True, False]
    assert out.bootstrap.tolist() == [False, False]  # a success end is terminal here
    assert out.final_obs["states"][0].tolist() == [2, 1]  # the finished episode's last observation
    assert out.obs["states"][0].tolist() == [0, 2]  # the next episode's first
    assert out.final_obs["states"][1].tolist() == out.obs["states"][1].tolist()  # rows that did not finish
    assert subs[0].seeds == [10, None]  # the auto-reset continues the sub-env's RNG


def test_the_time_limit_bootstraps_and_a_success_does_when_not_terminal():
    env, subs = make(terminal_on_success=False)
    env.reset()
    out = env.step(np.zeros((2, 9, 1), np.float32))
    assert out.dones.tolist() == [True, True] and out.env_steps.tolist() == [2, 9]
    assert out.bootstrap.tolist() == [True, True] and out.successes.tolist() == [True, False]


def test_episode_lengths_count_env_steps_as_executed():
    env, _ = make()
    stats = EpisodeStats(2)
    out = env.reset()
    for _ in range(3):
        out = env.step(np.zeros((2, 4, 1), np.float32))
        stats.record(out, out.executed_steps(4))
    assert [length for _, length, _ in stats.finished] == [2, 2, 2, 9]  # not 4, 4, 4, 12: whole chunks


def test_group_windows_count_each_sub_envs_first_episode_only():
    """Under grpo a short episode (sub-env 0 ends every 2 steps) would otherwise be counted three
    times in a window where a long one (sub-env 1: 9 steps) is counted once."""
    env, _ = make()
    stats = EpisodeStats(2, first_only=True)
    for window in range(2):
        env.reset()
        for _ in range(3):
            out = env.step(np.zeros((2, 4, 1), np.float32))
            stats.record(out, out.executed_steps(4))
        assert [length for _, length, _ in stats.finished] == [2, 9] * (window + 1)
        stats.restart()  # the next window: both count again


def test_reset_envs_restarts_only_those_sub_envs():
    env, subs = make()
    env.reset()
    env.step(np.zeros((2, 1, 1), np.float32))
    obs = env.reset_envs([1])
    assert obs["states"].tolist() == [[1, 1], [0, 2]]
