"""Evaluation episodes, their success interval, and videos: files that decode, TensorBoard images."""

import json
import os

import numpy as np
import pytest
import torch
from video_files import decode_mp4

from embodied_async.data import PolicyOutput
from embodied_async.evaluation import EvalResult, run_episodes, wilson_interval, write_videos
from envs.synthetic.configuration_synthetic import SyntheticImageConfig
from envs.synthetic.synthetic_env import SyntheticImageEnv


class TowardsTarget:
    """Moves the cursor towards the target at full speed (sign of the gap): reaches it or, for
    ``stall`` sub-envs, moves away from it until the time limit (standing still would succeed
    where a marker is drawn within reach of the start)."""

    def __init__(self, env, stall=()):
        self.env, self.stall = env, set(stall)

    def predict(self, obs, mode="train"):
        assert mode == "eval" and "video_frames" not in obs  # the policy never sees the video frames
        gap = self.env.targets - self.env.cursors
        direction = np.sign(gap)
        stalled = list(self.stall)
        direction[stalled] = np.where(gap[stalled] >= 0, -1.0, 1.0)
        actions = np.zeros((self.env.num_envs, 1, self.env.cfg.action_dim), np.float32)
        actions[:, 0, 0] = direction
        return PolicyOutput(actions=torch.from_numpy(actions), logprobs=None, values=None, forward_inputs={})


def synthetic(num_envs, render_video=True, seed=3, **kw):
    cfg = SyntheticImageConfig(image_size=[48, 64], action_dim=2, max_episode_steps=12, render_video=render_video,
                               video_size=[30, 41], **kw)  # odd sides: the writer pads to even ones
    return SyntheticImageEnv(cfg, num_envs, seed=seed)


def test_wilson_interval_matches_known_values():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and abs(high - 0.2775) < 1e-4
    low, high = wilson_interval(8, 10)
    assert abs(low - 0.4902) < 1e-4 and abs(high - 0.9433) < 1e-4
    assert wilson_interval(5, 5)[1] == 1.0


def test_episodes_split_over_sub_envs_and_recorded_episodes_end_on_their_last_frame():
    env = synthetic(3)
    result = run_episodes(TowardsTarget(env, stall=[1]), env, num_episodes=6, video_episodes=2)
    assert len(result.successes) == 6 and sorted(result.successes) == [False] * 2 + [True] * 4
    assert [v.sub_env for v in sorted(result.videos, key=lambda v: v.sub_env)] == [0, 1]
    stalled = next(v for v in result.videos if v.sub_env == 1)
    assert not stalled.success and len(stalled.rewards) == 12 and stalled.frames.shape == (13, 30, 41, 3)
    reached = next(v for v in result.videos if v.sub_env == 0)
    assert reached.success and reached.frames.shape[0] == len(reached.rewards) + 1
    # the last frame shows the finished episode (cursor on the target), not the next one's start
    last = reached.frames[-1]
    cursor_cols = np.flatnonzero((last == (0, 120, 255)).all(-1).any(0))
    target_cols = np.flatnonzero((last == (255, 220, 0)).all(-1).any(0))
    assert len(cursor_cols) and len(target_cols)
    assert abs(cursor_cols.mean() - target_cols.mean()) <= 3
    summary = result.summary()
    assert summary["success_rate"] == pytest.approx(4 / 6) and summary["episodes"] == 6
    assert summary["success_rate_ci95"][0] < 4 / 6 < summary["success_rate_ci95"][1]


def test_an_env_without_video_frames_is_refused_when_videos_are_asked_for():
    env = synthetic(2, render_video=False)
    with pytest.raises(ValueError, match="render_video"):
        run_episodes(TowardsTarget(env), env, num_episodes=2, video_episodes=1)
    assert len(run_episodes(TowardsTarget(env), env, num_episodes=2).successes) == 2


def test_videos_decode_with_every_frame_and_sidecar_and_tensorboard_images(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from embodied_async.metrics import MetricLogger

    env = synthetic(2)
    result = run_episodes(TowardsTarget(env, stall=[1]), env, num_episodes=2, video_episodes=2)
    paths = write_videos(result.videos, str(tmp_path / "videos"), fps=10)
    for video, path in zip(result.videos, paths):
        assert ("success" if video.success else "failure") in os.path.basename(path)
        frames = decode_mp4(path)
        assert frames.shape == (len(video.frames), 30, 42, 3)  # the width padded to an even one
        decoded = frames[:, :, :41].astype(float)
        assert np.abs(decoded - video.frames).mean() < 12  # lossy, but the same pictures
        side = json.load(open(path[:-4] + ".json"))
        assert side["instruction"] == "move the cursor onto the marker" and side["success"] == video.success
        assert side["step_rewards"] == pytest.approx(video.rewards) and side["frames"] == len(video.frames)
    logger = MetricLogger(str(tmp_path / "log"))
    logger.log_videos(result.videos, step=3)
    logger.close()
    events = EventAccumulator(str(tmp_path / "log" / "tensorboard"), size_guidance={"images": 0}).Reload()
    tags = events.Tags()["images"]
    assert len(tags) == 2 and all(t.startswith("eval_video/episode") for t in tags)
    image = events.Images(tags[0])[0]
    assert image.step == 3 and image.encoded_image_string[:6] in (b"GIF87a", b"GIF89a")


def test_empty_result_summary_is_nan_not_an_error():
    summary = EvalResult().summary()
    assert summary["episodes"] == 0 and np.isnan(summary["success_rate"])


def test_an_evaluation_stops_once_its_failures_rule_the_target_out():
    """Two of four sub-envs always fail: 40 episodes at target 0.9 allow 4 failures; the third
    complete round holds 6, so the evaluation ends there, scoring those 12 episodes (0.5)."""
    env = synthetic(4, render_video=False)
    stopped = run_episodes(TowardsTarget(env, stall=[1, 3]), env, num_episodes=40, stop_below=0.9)
    assert stopped.stopped_below and len(stopped.successes) == 12
    assert stopped.summary()["success_rate"] == 0.5
    whole = run_episodes(TowardsTarget(env, stall=[1, 3]), env, num_episodes=40, stop_below=0.4)  # 24 allowed
    assert not whole.stopped_below and len(whole.successes) == 40 and whole.summary()["success_rate"] == 0.5
