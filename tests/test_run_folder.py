"""The run folder has one owner (``run_folder``): how a checkpoint is written and found again,
what makes a folder one, and the hints a wrong folder gets."""

import errno
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


@pytest.mark.parametrize("failure", [OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
                                     RuntimeError("actor[0].save_checkpoint failed: SafetensorError: Error while "
                                                  "serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                                  "\"No space left on device\" }) (os error 28)")])
def test_a_checkpoint_the_folder_cannot_take_ends_in_one_line_and_leaves_the_last_one_whole(tmp_path, failure):
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    first = write(root, 2)

    def fails(folder):
        with open(os.path.join(folder, "model.safetensors"), "w") as f:
            f.write("half a tensor")
        raise failure

    with pytest.raises(run_folder.StorageError) as err:
        run_folder.write_checkpoint(str(root), 3, fails, {"step": 3})
    message = str(err.value)
    assert "\n" not in message and "global_step_3" in message and "MiB free" in message
    assert f"resume with runner.resume_dir={first}" in message
    assert sorted(os.listdir(root)) == ["global_step_2", "latest"]  # the partial folder is gone
    assert run_folder.latest_checkpoint(str(root)) == first
    run_folder.verify(first, "runner.resume_dir")


def test_only_storage_failures_are_taken_for_a_full_disk():
    assert run_folder.storage_errno(RuntimeError("worker failed: ... (os error 28)")) == errno.ENOSPC
    assert run_folder.storage_errno(RuntimeError("a [Errno 122] Disk quota exceeded: '/x'")) == errno.EDQUOT
    assert run_folder.storage_errno(RuntimeError("... (os error 15)")) is None
    # a permission error in a worker's traceback may be any file's (/dev/shm, a CUDA call): not taken
    assert run_folder.storage_errno(RuntimeError("PermissionError: [Errno 13] Permission denied: '/dev/shm/x'")) \
        is None
    remote = RuntimeError("ray::ActorWorker.save_checkpoint() ... OSError: [Errno 30] Read-only file system")
    remote.cause = OSError(errno.EROFS, "Read-only file system")  # Ray's wrapper keeps the worker's own error
    assert run_folder.storage_errno(remote) == errno.EROFS
    assert run_folder.storage_errno(ValueError("cannot reshape array")) is None
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert run_folder.storage_errno(wrapped) == errno.ENOSPC


def test_a_failed_rename_puts_the_same_steps_earlier_checkpoint_back(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    first = write(root, 2)
    real_replace = os.replace

    def replace(src, dst):
        if src.endswith("global_step_2.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(run_folder.os, "replace", replace)
    with pytest.raises(run_folder.StorageError, match="make room and resume"):
        write(root, 2)
    assert sorted(os.listdir(root)) == ["global_step_2", "latest"]
    assert run_folder.latest_checkpoint(str(root)) == first
    run_folder.verify(first, "runner.resume_dir")


def test_metrics_that_cannot_be_written_end_the_run_instead_of_being_dropped(tmp_path):
    from embodied_async.metrics import MetricLogger

    log = tmp_path / "run"
    log.mkdir()
    os.symlink("/dev/full", log / "metrics.jsonl")  # every write answers ENOSPC, as a full disk does
    logger = MetricLogger(str(log), backends=[])
    with pytest.raises(run_folder.StorageError, match=r"cannot write the run's metrics .*No space left on device"):
        logger.log({"step": 1, "train/actor/policy_loss": 0.5})
    with pytest.raises(run_folder.StorageError):
        logger.close()
