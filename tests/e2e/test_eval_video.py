"""runner.eval_video: evaluation episodes of a real ManiSkill task as mp4 files under the log
folder (success or failure in the name, a JSON beside each) and in TensorBoard."""

import json
import os

import pytest

from conftest import run_recipe
from video_files import decode_mp4


@pytest.mark.slow
def test_state_based_maniskill_evaluation_writes_playable_videos(tmp_path):
    log_path = tmp_path / "run"
    _, records = run_recipe("maniskill_async_ppo_mlp", log_path, "runner.max_steps=1", "runner.eval_video=true",
                            "runner.eval_episodes=2", "runner.eval_num_envs=2", "runner.eval_video_episodes=2",
                            "env.video_size=[96,128]", "env.max_episode_steps=20")
    folder = log_path / "videos" / "step_1"
    videos = sorted(f for f in os.listdir(folder) if f.endswith(".mp4"))
    assert len(videos) == 2 and all(("_success" in v) != ("_failure" in v) for v in videos)
    for name in videos:
        side = json.load(open(folder / name.replace(".mp4", ".json")))
        frames = decode_mp4(str(folder / name))
        # 20 decisions (the time limit, or fewer on success) + the reset's frame, at the video size
        assert frames.shape == (side["frames"], 96, 128, 3) and side["frames"] == len(side["step_rewards"]) + 1
        assert side["frames"] <= 21 and side["instruction"] == "push the cube to the goal region"
        assert frames.std() > 10  # a rendered scene, not a blank image
    assert "eval/episode_len" in records[-1]
    assert any(f.startswith("events.out") for f in os.listdir(log_path / "tensorboard"))
