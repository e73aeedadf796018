"""Evaluation episodes: deterministic actions on an env, the success rate with its 95 % interval,
episode lengths and returns, and videos of the first episodes.

Used by the rollout worker (periodic evaluation during training) and by ``scripts/eval.py``. A
video needs an env built with ``render_video`` on (its observations then carry ``video_frames``
``[B, H, W, 3]`` uint8, and ``final_obs`` the frame of each episode's last state); a recorded
episode has one frame after its reset and one after each decision.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

VIDEO_KEY = "video_frames"
EVAL_SEED_OFFSET = 10_000_019  # evaluation episodes never start from a training env's seed
EVAL_SEED_STRIDE = 100_003  # between the evaluations of consecutive versions (more than any sub-env count)


def evaluation_seed(run_seed: int, version: int = 0) -> int:
    """The seed an evaluation of policy ``version`` resets its env with (sub-env ``i`` gets ``+ i``):
    every run with ``runner.seed = run_seed`` evaluates version ``version`` on the same episodes
    (two recipes compared at equal versions face equal episodes), and each version on fresh ones."""
    return EVAL_SEED_OFFSET + int(run_seed) + EVAL_SEED_STRIDE * int(version)


@dataclass
class EpisodeVideo:
    """One recorded evaluation episode of sub-env ``sub_env``."""

    sub_env: int
    success: bool
    instruction: str
    frames: np.ndarray  # uint8 [T + 1, H, W, 3]: the reset's frame, then one per decision
    rewards: List[float]  # [T]: the reward of each decision (summed over its action chunk)

    def file_stem(self, index: int) -> str:
        return f"episode{index:03d}_env{self.sub_env}_{'success' if self.success else 'failure'}"


@dataclass
class EvalResult:
    successes: List[bool] = field(default_factory=list)
    returns: List[float] = field(default_factory=list)
    lengths: List[int] = field(default_factory=list)  # env steps per episode, as executed
    tasks: List[str] = field(default_factory=list)  # each episode's task (env.tasks; empty with one task)
    videos: List[EpisodeVideo] = field(default_factory=list)
    stopped_below: bool = False  # ended early: the target of ``run_episodes(stop_below=)`` was out of reach

    def summary(self, reports_success: bool = True) -> Dict[str, object]:
        """Success rate with its Wilson 95 % interval, mean return and episode length."""
        n = len(self.successes)
        rate = float(np.mean(self.successes)) if n and reports_success else float("nan")
        low, high = wilson_interval(int(sum(self.successes)), n) if reports_success else (float("nan"),) * 2
        per_task, per_task_ci95, per_task_episodes = {}, {}, {}
        for task in dict.fromkeys(self.tasks):  # each task's success rate, in the order of the sub-envs
            scored = [s for s, t in zip(self.successes, self.tasks) if t == task]
            per_task[task] = float(np.mean(scored)) if reports_success else float("nan")
            per_task_ci95[task] = list(wilson_interval(int(sum(scored)), len(scored))) if reports_success \
                else [float("nan")] * 2
            per_task_episodes[task] = len(scored)
        return {"episodes": n, "success_rate": rate, "success_rate_ci95": [low, high],
                "episode_return": float(np.mean(self.returns)) if n else float("nan"),
                "episode_length": float(np.mean(self.lengths)) if n else float("nan"), "per_task": per_task,
                "per_task_ci95": per_task_ci95, "per_task_episodes": per_task_episodes}


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple:
    """The Wilson score interval of a success rate (sound at 0 %, 100 % and few episodes)."""
    if trials == 0:
        return float("nan"), float("nan")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def failures_allowed(num_episodes: int, target: float) -> int:
    """How many of ``num_episodes`` may fail with the success rate still at ``target`` or above."""
    return num_episodes - math.ceil(target * num_episodes - 1e-9)


def run_episodes(policy, env, num_episodes: int, video_episodes: int = 0, seed: Optional[int] = None,
                 stop_below: Optional[float] = None, mode: str = "eval") -> EvalResult:
    """Run ``num_episodes`` episodes, the same number on every sub-env, with ``policy.predict(obs,
    mode)`` (``"eval"``: the deterministic decision rule; ``"train"``: the sampled policy RL
    trains); record the first episode of sub-envs ``0 .. video_episodes - 1``.

    ``stop_below``: stop once the rounds every sub-env has completed hold more failures than a
    success rate of ``stop_below`` over all ``num_episodes`` allows (those episodes are part of the
    full evaluation, so it would end below it); the result then holds those rounds only."""
    num_envs = env.num_envs
    if num_episodes % num_envs:
        raise ValueError(f"{num_episodes} episodes do not split evenly over {num_envs} sub-envs")
    per_env = num_episodes // num_envs
    allowed = failures_allowed(num_episodes, stop_below) if stop_below is not None else None
    recorded = min(video_episodes, num_envs)
    result = EvalResult()
    episodes: List[List[tuple]] = [[] for _ in range(num_envs)]  # per sub-env: (success, return, length)
    counts, returns, lengths = np.zeros(num_envs, int), np.zeros(num_envs), np.zeros(num_envs, int)
    out = env.reset(seed=seed)
    if recorded and VIDEO_KEY not in out.obs:
        raise ValueError(f"the env gives no '{VIDEO_KEY}': build it with render_video on to record videos")
    frames = [[out.obs[VIDEO_KEY][i]] for i in range(recorded)]
    rewards: List[List[float]] = [[] for _ in range(recorded)]
    recording = [True] * recorded
    while counts.min() < per_env:
        obs = {k: v for k, v in out.obs.items() if k != VIDEO_KEY}
        actions = policy.predict(obs, mode=mode).actions
        actions = actions.float().cpu().numpy() if hasattr(actions, "cpu") else np.asarray(actions)
        out = env.step(actions)
        step_rewards = np.where(np.isfinite(out.rewards), out.rewards, 0.0)
        returns += step_rewards
        lengths += out.executed_steps(env.spec.num_action_chunks)
        for i in range(recorded):
            if recording[i]:
                last = out.final_obs if out.dones[i] else out.obs
                frames[i].append(last[VIDEO_KEY][i])
                rewards[i].append(float(step_rewards[i]))
        for i in np.flatnonzero(out.dones):
            if counts[i] < per_env:
                episodes[i].append((bool(out.successes[i]), float(returns[i]), int(lengths[i])))
                counts[i] += 1
            if i < recorded and recording[i]:
                recording[i] = False
                result.videos.append(EpisodeVideo(int(i), bool(out.successes[i]), str(obs["task_descriptions"][i]),
                                                  np.stack(frames[i]), rewards[i]))
            returns[i], lengths[i] = 0.0, 0
        if allowed is not None and counts.min() < per_env:
            rounds = counts.min()
            if sum(not success for e in episodes for success, _, _ in e[:rounds]) > allowed:
                episodes = [e[:rounds] for e in episodes]
                result.stopped_below = True
                break
    scored = [episode for e in episodes for episode in e]  # sub-env by sub-env
    result.successes, result.returns, result.lengths = ([episode[k] for episode in scored] for k in range(3))
    if env.spec.tasks:
        result.tasks = [env.spec.tasks[i] for i, e in enumerate(episodes) for _ in e]
    return result


def write_videos(videos: List[EpisodeVideo], folder: str, fps: int = 10) -> List[str]:
    """Each episode as ``<stem>.mp4`` (H.264) and ``<stem>.json`` (instruction, success, step
    rewards) in ``folder``; returns the mp4 paths."""
    import imageio.v2 as imageio

    os.makedirs(folder, exist_ok=True)
    paths = []
    for index, video in enumerate(videos):
        stem = os.path.join(folder, video.file_stem(index))
        # libx264 with yuv420p wants even sides: pad by a row/column instead of imageio's resize
        frames = _even_sides(video.frames)
        with imageio.get_writer(stem + ".mp4", fps=fps, codec="libx264", pixelformat="yuv420p",
                                macro_block_size=1, ffmpeg_log_level="error") as writer:
            for frame in frames:
                writer.append_data(frame)
        with open(stem + ".json", "w") as f:
            json.dump({"instruction": video.instruction, "success": video.success, "sub_env": video.sub_env,
                       "frames": int(len(video.frames)), "step_rewards": video.rewards,
                       "episode_return": float(sum(video.rewards))}, f, indent=1)
        paths.append(stem + ".mp4")
    return paths


def _even_sides(frames: np.ndarray) -> np.ndarray:
    height, width = frames.shape[1:3]
    return np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")
