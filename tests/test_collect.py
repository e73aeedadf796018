"""The ``collect`` command (``runner.mode: collect``): episodes of a scripted expert or of a run's
checkpoint (a teacher) written as a LeRobot dataset that DatasetReader reads back (cameras, states,
executed actions, the instruction as task, a seed per episode); appending; Ctrl-C; bad input named
in one line, exit 2; the old script's entry still runs it."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO_ROOT
from teacher_checkpoints import make_teacher

from embodied_async.datasets.reader import DatasetReader

pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

COMMAND = [sys.executable, "-m", "embodied_async", "collect"]


def run(*args, timeout=300, command=COMMAND):
    return subprocess.run([*command, *map(str, args)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def collection(root):
    with open(os.path.join(root, "meta", "collection.json")) as f:
        return json.load(f)


def collect_in_process(*args):
    """The driver's work here, for input refused before any worker starts."""
    from embodied_async.cli import collect

    return collect.drive(collect.parse([str(a) for a in args]))


@pytest.mark.slow
def test_scripted_episodes_of_an_rgb_env_are_read_back(tmp_path):
    out = tmp_path / "pushcube"
    proc = run("maniskill_pushcube_rgb_ee", "--source", "scripted", "--episodes", 2, "--out", out,
               "--num-workers", 1, "--codec", "h264", "--seed", 7)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[collect] 2/2 episodes kept, 2 attempted (source success 100%)" in proc.stdout
    reader = DatasetReader(str(out))
    assert reader.num_episodes == 2 and reader.fps == 20  # PushCube's control rate
    assert reader.features["observation.images.main"]["shape"] == [64, 64, 3]
    assert reader.features["observation.images.main"]["dtype"] == "video"
    assert reader.features["action"]["shape"] == [4]  # pd_ee_delta_pos: xyz + gripper
    assert reader.features["observation.state"]["shape"] == [25]  # the rgb mode's proprioception + TCP pose
    assert reader.tasks == ["push the cube to the goal region"]
    meta = collection(out)
    assert [e["seed"] for e in meta["episodes"]] == [7, 8]
    assert all(e["success"] and e["source"] == "scripted" and e["return_"] > 0 for e in meta["episodes"])
    assert meta["env"]["task"] == "PushCube-v1" and meta["env"]["image_size"] == [64, 64]
    assert "num_envs" not in meta["env"] and "render_video" not in meta["env"]
    frames = reader.episode_frames("observation.images.main", 0)
    assert frames.shape == (len(reader.episode_range(0)), 64, 64, 3) and frames.std() > 10  # a scene
    assert np.abs(reader.numbers["action"]).max() <= 1.0


@pytest.mark.slow
def test_a_push_to_the_hub_without_network_fails_in_one_line_and_leaves_the_dataset_complete(tmp_path, monkeypatch):
    """Through the old script's entry, which says where the command went."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # unreachable wherever the test runs
    out = tmp_path / "pushcube"
    proc = run("maniskill_pushcube", "--source", "scripted", "--episodes", 1, "--out", out, "--num-workers", 1,
               "--push-to-hub", "someone/pushcube-demos", command=[sys.executable, "scripts/collect_demos.py"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "scripts/collect_demos.py is now 'python -m embodied_async collect'" in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("collect error")]
    assert len(errors) == 1 and "dataset repo 'someone/pushcube-demos'" in errors[0] and "offline" in errors[0]
    assert "--repo-type dataset" in errors[0]
    assert DatasetReader(str(out)).num_episodes == 1  # written and sealed before the push was tried


@pytest.mark.slow
def test_a_state_trained_teacher_acts_on_privileged_states_while_the_dataset_records_images(tmp_path):
    teacher = make_teacher(str(tmp_path / "run"))  # state-mode PushCube, pd_joint_delta_pos
    out = tmp_path / "teacher"
    proc = run("maniskill_pushcube_rgb", f"--source=teacher:{teacher}", "--episodes", 2, "--out", out,
               "--num-workers", 1, "--keep-failures", "env.max_episode_steps=6", "env.image_size=[32,32]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reader = DatasetReader(str(out))
    assert reader.num_episodes == 2 and len(reader) == 12  # random weights: both run to the time limit
    assert reader.features["observation.images.main"]["shape"] == [32, 32, 3]
    assert "privileged_states" not in str(reader.features)  # the teacher's view is not recorded
    episodes = collection(out)["episodes"]
    assert [e["source"] for e in episodes] == [f"teacher:{teacher}"] * 2 and not any(e["success"] for e in episodes)
    # deterministic: the teacher's actions are its means, not samples
    assert np.abs(np.diff(reader.numbers["action"], axis=0)).max() < 0.5


def interrupt_when_kept(proc, timeout: float = 120) -> str:
    """SIGINT once a progress line says an episode is kept; the rest of the process's output."""
    deadline = time.time() + timeout
    for line in proc.stdout:
        if line.startswith("[collect] ") and not line.startswith("[collect] 0/") and "kept" in line:
            break
        assert time.time() < deadline, f"no episode kept within {timeout} s"
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=60)[0]


@pytest.mark.slow
def test_ctrl_c_keeps_the_episodes_so_far_and_an_append_continues_the_seeds(tmp_path):
    out = tmp_path / "state"
    proc = subprocess.Popen([*COMMAND, "maniskill_pushcube", "--source", "scripted", "--episodes", "1000", "--out",
                             str(out), "--num-workers", "1"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stdout = interrupt_when_kept(proc)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "[collect] stopped: the episodes written so far are kept" in stdout
    kept = DatasetReader(str(out)).num_episodes
    assert 1 <= kept < 1000 and [e["seed"] for e in collection(out)["episodes"]] == list(range(kept))

    proc = run("maniskill_pushcube", "--source", "scripted", "--episodes", 2, "--out", out, "--num-workers", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["seed"] for e in collection(out)["episodes"]] == list(range(kept + 2))  # two workers, in order
    reader = DatasetReader(str(out))
    assert reader.num_episodes == kept + 2 and "observation.images.main" not in reader.features  # state: no video
    assert reader.features["action"]["shape"] == [8]  # pd_joint_delta_pos: 7 joints + gripper


def test_appending_episodes_of_another_env_config_is_refused_before_collecting(tmp_path, capsys):
    from embodied_async.cli import collect
    from embodied_async.collection import check_plan
    from embodied_async.datasets.writer import DatasetWriter

    args = collect.parse(["maniskill_pushcube", "--source", "scripted", "--episodes", "1", "--out", str(tmp_path)])
    theirs = dict(check_plan(collect.collection_config(args)[0]).collection_env, max_episode_steps=30)
    features = {"observation.state": {"dtype": "float32", "shape": [2]}, "action": {"dtype": "float32", "shape": [1]}}
    with DatasetWriter(str(tmp_path), 20, features, collection={"env": theirs}) as writer:
        writer.add_episode({"observation.state": np.zeros((3, 2)), "action": np.zeros((3, 1))}, "push", seed=0)
    assert collect_in_process("maniskill_pushcube", "--source", "scripted", "--episodes", 1, "--out", tmp_path) == 2
    err = capsys.readouterr().err
    assert "was collected in another env config (env.max_episode_steps: 30 there, 50 here)" in err


def test_an_unknown_env_is_named_with_the_choices(tmp_path, capsys):
    assert collect_in_process("maniskill_pushcub", "--source", "scripted", "--episodes", 1, "--out", tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: 'maniskill_pushcub' is neither an env yaml") and "maniskill_pushcube," in err
    assert "\n" not in err


def test_a_teacher_of_another_control_mode_is_refused_naming_both(tmp_path, capsys):
    teacher = make_teacher(str(tmp_path / "run"))
    assert collect_in_process("maniskill_pushcube_rgb_ee", "--source", f"teacher:{teacher}", "--episodes", 1,
                              "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "the teacher was trained on control_mode='pd_joint_delta_pos', this env is control_mode='pd_ee_delta_pos'" \
        in err and "env.control_mode=pd_joint_delta_pos" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--source", "teacher:/nonexistent"], "not a checkpoint folder of a run"),
    (["--source", "scripted", "env.num_action_chunks=2"], "env.num_action_chunks=2: the envs return one observation"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert collect_in_process("maniskill_pushcube", *args, "--episodes", 1, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("config error:") and message in err and err.count("\n") == 1


def test_a_family_without_a_scripted_expert_is_refused(tmp_path, capsys):
    assert collect_in_process("synthetic_bridge", "--source", "scripted", "--episodes", 1, "--out", tmp_path) == 2
    assert "has no scripted expert (env.scripted_expert): use --source teacher:" in capsys.readouterr().err


def test_the_collect_and_evaluation_sections_are_checked_at_start_up_and_refused_in_training_modes():
    from embodied_async.config import ConfigError
    from embodied_async.config.recipes import resolve_recipe

    with pytest.raises(ConfigError, match="runner.mode=collect needs collect.out"):
        resolve_recipe("maniskill_async_ppo_mlp", ["runner.mode=collect"])
    with pytest.raises(ConfigError, match="collect.source='demo': use 'scripted' or 'teacher:"):
        resolve_recipe("maniskill_async_ppo_mlp", ["runner.mode=collect", "collect.out=x", "collect.source=demo"])
    with pytest.raises(ConfigError, match="collect.episodes=5 with runner.mode=ppo: only runner.mode=collect reads it"):
        resolve_recipe("maniskill_async_ppo_mlp", ["collect.episodes=5"])
    with pytest.raises(ConfigError, match="evaluation.episodes=6 must be a multiple of the sub-envs"):
        resolve_recipe("maniskill_async_ppo_mlp", ["runner.mode=eval", "evaluation.episodes=6", "env.num_envs=4"])
    with pytest.raises(ConfigError, match="evaluation.videos=2 with runner.mode=sft: only runner.mode=eval reads it"):
        resolve_recipe("maniskill_sft_openvla_tiny", ["evaluation.videos=2"])
