"""Evaluation videos and the checkpoint evaluator on the default recipe (ManiSkill PushCube, state):
runner.eval_video writes playable mp4 files under the log folder (success or failure in the name,
a JSON beside each) and TensorBoard images; the eval command (runner.mode=eval) scores the run's
saved checkpoint, with one evaluator or several."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, run_recipe
from video_files import decode_mp4

from embodied_async.checkpoint_io import write_manifest

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


def check_videos(folder, size, instruction):
    videos = sorted(f for f in os.listdir(folder) if f.endswith(".mp4"))
    for name in videos:
        assert ("_success" in name) != ("_failure" in name)
        side = json.load(open(os.path.join(folder, name.replace(".mp4", ".json"))))
        frames = decode_mp4(os.path.join(folder, name))
        # one frame after the reset and one per decision, at the video size
        assert frames.shape == (side["frames"], *size, 3) and side["frames"] == len(side["step_rewards"]) + 1
        assert side["instruction"] == instruction and side["success"] == ("_success" in name)
        assert frames.std() > 10  # a rendered scene, not a blank image
    return videos


@pytest.mark.slow
def test_training_writes_evaluation_videos_and_eval_py_scores_the_checkpoint(tmp_path):
    log_path = tmp_path / "run"
    _, records = run_recipe("maniskill_async_ppo_mlp", log_path, "runner.max_steps=1", "runner.eval_video=true",
                            "runner.eval_episodes=2", "runner.eval_num_envs=2", "runner.eval_video_episodes=2",
                            "env.video_size=[96,128]", "env.max_episode_steps=10",
                            "env.num_envs=4", "rollout.num_steps=8", "actor.global_batch_size=32",
                            "actor.micro_batch_size=32", "algorithm.update_epochs=1")
    videos = check_videos(log_path / "videos" / "step_1", (96, 128), "push the cube to the goal region")
    assert len(videos) == 2
    assert all(json.load(open(log_path / "videos" / "step_1" / v.replace(".mp4", ".json")))["frames"] <= 11
               for v in videos)  # 10 decisions at most (the time limit) + the reset's frame
    assert "eval/episode_len" in records[-1]
    assert any(f.startswith("events.out") for f in os.listdir(log_path / "tensorboard"))

    checkpoint = log_path / "checkpoints" / "global_step_1"
    report_path = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "embodied_async", "eval", str(checkpoint),
                           "--episodes", "4", "--num-envs", "2", "--video-dir", str(tmp_path / "eval_videos"),
                           "--videos", "1", "--json", str(report_path), "env.video_size=[64,64]"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.load(open(report_path))
    assert report["episodes"] == 4 and len(report["episode_successes"]) == 4
    low, high = report["success_rate_ci95"]
    assert 0.0 <= low <= report["success_rate"] <= high <= 1.0 and high - low > 0.3  # 4 episodes: wide
    assert 1 <= report["episode_length"] <= 10 and report["task"] == "PushCube-v1"
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("[eval] success ") and "95% CI" in summary and "over 4 episodes" in summary
    assert len(check_videos(tmp_path / "eval_videos", (64, 64), "push the cube to the goal region")) == 1
    assert json.loads(open(os.path.join(report["log"], "metrics.jsonl")).readline())["eval/episodes"] == 4

    # two evaluators (Ray processes) of one sub-env each face the episodes one evaluator of two faces
    scores = {}
    for evaluators, num_envs in ((1, 2), (2, 1)):
        path = tmp_path / f"report{evaluators}.json"
        proc = subprocess.run([sys.executable, "-m", "embodied_async", "eval", str(checkpoint), "--episodes", "4",
                               "--num-envs", str(num_envs), "--evaluators", str(evaluators), "--json", str(path),
                               f"runner.logger.log_path={tmp_path / f'eval{evaluators}'}"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        scores[evaluators] = json.load(open(path))
    assert scores[1]["episode_successes"] == scores[2]["episode_successes"]
    assert abs(scores[1]["episode_return"] - scores[2]["episode_return"]) <= 1e-4 * abs(scores[1]["episode_return"])


def test_eval_names_a_bad_target_and_the_fix(tmp_path):
    fake = tmp_path / "checkpoints" / "global_step_3"
    fake.mkdir(parents=True)
    (fake / "runner.json").write_text("{}")
    (fake / "model.json").write_text("{}")
    command = [sys.executable, "-m", "embodied_async", "eval", str(fake)]
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("eval error:")
    assert "holds runner.json but no manifest.json: a checkpoint that was never completed" in proc.stderr
    write_manifest(str(fake))
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("eval error:")
    assert ".hydra/config.yaml is missing" in proc.stderr and "--recipe" in proc.stderr


def test_the_old_eval_script_says_where_it_went_and_runs_the_command(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "eval.py"), str(tmp_path / "nothing")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    first, second = proc.stderr.splitlines()[:2]
    assert first.startswith("[eval] scripts/eval.py is now 'python -m embodied_async eval'")
    assert proc.returncode == 2 and second.startswith("eval error:") and "nothing" in second
