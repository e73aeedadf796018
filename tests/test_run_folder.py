"""The run folder has one owner (``run_folder``): how a checkpoint is written and found again,
what makes a folder one, and the hints a wrong folder gets."""

import json
import os

import pytest

from embodied_async import run_folder
from embodied_async.checkpoint_io import CheckpointError


def write(root, step, version=None):
    def contents(folder):
        with open(os.path.join(folder, "actor_state.json"), "w") as f:
            json.dump({"step": step}, f)
        return step if version is None else version

    return run_folder.write_checkpoint(str(root), step, contents, {"step": step, "env_steps": 10 * step})


def test_a_checkpoint_is_sealed_named_latest_and_read_back(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    first = write(root, 2)
    assert run_folder.is_checkpoint(first) and run_folder.latest_checkpoint(str(root)) == first
    # the trainer's version is the truth: an update the runner had not counted is in the checkpoint
    second = write(root, 3, version=4)
    assert run_folder.latest_checkpoint(str(root)) == second
    assert run_folder.read_runner_state(second) == {"step": 4, "env_steps": 30, "version": 4}
    assert sorted(os.listdir(root)) == ["global_step_2", "global_step_3", "latest"]  # no .tmp or .old left
    assert run_folder.log_folder(second) == str(tmp_path / "run")
    assert run_folder.videos_folder(str(tmp_path / "run"), 3) == str(tmp_path / "run" / "videos" / "step_3")


def test_a_damaged_or_unsealed_folder_is_not_a_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    path = write(root, 1)
    with open(os.path.join(path, "actor_state.json"), "a") as f:
        f.write(" ")
    with pytest.raises(CheckpointError, match="runner.resume_dir=.*actor_state.json: wrong size"):
        run_folder.read_runner_state(path)
    os.remove(os.path.join(path, "manifest.json"))
    assert not run_folder.is_checkpoint(path) and run_folder.latest_checkpoint(str(root)) is None
    assert "holds no runner.json and manifest.json" in run_folder.not_a_checkpoint(path, "model.init_from")


def test_a_folder_that_holds_checkpoints_is_pointed_to_its_newest(tmp_path):
    log = tmp_path / "run"
    (log / "checkpoints").mkdir(parents=True)
    newest = write(log / "checkpoints", 5)
    for folder, what in ((log / "checkpoints", "a checkpoints root"), (log, "a run's log folder")):
        message = run_folder.not_a_checkpoint(str(folder), "runner.resume_dir")
        assert f"looks like {what}: its newest checkpoint is {newest!r}" in message
    assert run_folder.not_a_checkpoint(newest, "runner.resume_dir") is None
    assert "is not a folder" in run_folder.not_a_checkpoint(str(tmp_path / "nowhere"), "runner.resume_dir")


def test_a_checkpoint_resumes_only_into_its_family(tmp_path, capsys):
    from types import SimpleNamespace

    path = write(tmp_path, 1)
    run_folder.write_model_info(path, SimpleNamespace(name="openvla", path="base-a"), full=False)
    assert run_folder.checkpoint_family(path) == "openvla"
    with pytest.raises(CheckpointError, match="holds a 'openvla' policy, but this run's model.name is 'pi0'"):
        run_folder.check_resume_model(path, SimpleNamespace(name="pi0", path="base-a"))
    run_folder.check_resume_model(path, SimpleNamespace(name="openvla", path="base-b"))
    assert "trainable weights for the base 'base-a'" in capsys.readouterr().out


def test_every_runner_mode_has_its_mode_class():
    from embodied_async.config.schema import RUNNER_MODES
    from embodied_async.runner import MODES
    from embodied_async.runner.graph import Mode

    assert set(MODES) == set(RUNNER_MODES)
    for mode in MODES.values():
        assert issubclass(mode, Mode) and mode.name and mode.evaluate_method
        for hook in ("build", "version_after_step", "progress_line"):
            assert getattr(mode, hook) is not getattr(Mode, hook), (mode, hook)
