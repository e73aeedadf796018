"""Damaged datasets are refused where a run opens them (``open_dataset``), in one line naming the
file and the fix: non-finite numbers, a header that disagrees with its data, video files that are
missing, garbage, cut short or of another size; a video damaged inside is refused at its first
decode the same way. Each case damages a small dataset our writer made (no simulator)."""

import json
import os
import shutil
import subprocess
import sys

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES, REPO_ROOT

from embodied_async.contracts import EnvSpec
from embodied_async.datasets.batches import SupervisedSamples, batch_stream, open_dataset
from embodied_async.datasets.integrity import check_video_files
from embodied_async.datasets.lerobot_format import DatasetError
from embodied_async.datasets.reader import DatasetReader
from embodied_async.datasets.video import VideoFileWriter
from embodied_async.datasets.writer import DatasetWriter

CAMERA, STATE, ACTION = "observation.images.main", "observation.state", "action"
SIDE, STATE_SIZE, ACTION_SIZE, FPS = 32, 4, 7, 20
EPISODES, LENGTH = 3, 6
FEATURES = {CAMERA: {"dtype": "video", "shape": [SIDE, SIDE, 3]},
            STATE: {"dtype": "float32", "shape": [STATE_SIZE]}, ACTION: {"dtype": "float32", "shape": [ACTION_SIZE]}}
SPEC = EnvSpec(obs_shapes={"main_images": (SIDE, SIDE, 3), "states": (STATE_SIZE,)},
               obs_dtypes={"main_images": "uint8", "states": "float32"}, action_dim=ACTION_SIZE, control_hz=FPS)
DATA = os.path.join("data", "chunk-000", "file-000.parquet")
VIDEO = os.path.join("videos", CAMERA, "chunk-000", "file-000.mp4")
INFO = os.path.join("meta", "info.json")
RECOLLECT = "re-collect the dataset with python -m embodied_async collect"
COPY_AGAIN = "copy the file again from where the dataset came from"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pristine") / "demos")
    rng = np.random.default_rng(0)
    with DatasetWriter(root, FPS, FEATURES) as writer:
        for _ in range(EPISODES):
            writer.add_episode({CAMERA: rng.integers(0, 256, (LENGTH, SIDE, SIDE, 3), dtype=np.uint8),
                                STATE: rng.uniform(-1, 1, (LENGTH, STATE_SIZE)).astype(np.float32),
                                ACTION: rng.uniform(-1, 1, (LENGTH, ACTION_SIZE)).astype(np.float32)}, "push")
    return root


@pytest.fixture
def dataset(pristine, tmp_path):
    """A copy of the pristine dataset, to damage."""
    return shutil.copytree(pristine, str(tmp_path / "damaged"))


def refusal(root: str) -> str:
    """The one-line message a run gets opening the dataset at ``root``."""
    with pytest.raises(DatasetError) as refused:
        open_dataset(root, {}, SPEC)
    message = str(refused.value)
    assert "\n" not in message, message
    return message


def set_value(root: str, key: str, episode: int, frame: int, value: float) -> None:
    """Frame ``frame`` of episode ``episode`` gets ``value`` in its first entry of ``key``."""
    path = os.path.join(root, DATA)
    table = pq.read_table(path)
    rows = np.flatnonzero((table.column("episode_index").to_numpy() == episode)
                          & (table.column("frame_index").to_numpy() == frame))
    values = table.column(key).combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1).copy()
    values[rows, 0] = value
    column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    pq.write_table(table.set_column(table.schema.get_field_index(key), key, column), path)


def edit_info(root: str, change) -> None:
    path = os.path.join(root, INFO)
    with open(path) as f:
        info = json.load(f)
    change(info)
    with open(path, "w") as f:
        json.dump(info, f)


def test_the_pristine_dataset_opens(pristine):
    reader, keys = open_dataset(pristine, {}, SPEC)
    assert reader.num_episodes == EPISODES and keys == {"main_images": CAMERA, "states": STATE, "actions": ACTION}
    assert reader.episode_frames(CAMERA, EPISODES - 1).shape == (LENGTH, SIDE, SIDE, 3)


def test_a_nan_action_in_one_frame_is_refused_naming_episode_frame_and_key(dataset):
    set_value(dataset, ACTION, episode=1, frame=3, value=np.nan)
    message = refusal(dataset)
    assert message.startswith(os.path.join(dataset, DATA))
    assert "'action' is nan in episode 1, frame 3 (1 frame with non-finite 'action' in all, in episodes [1])" in message
    assert RECOLLECT in message


def test_an_infinite_state_is_refused(dataset):
    set_value(dataset, STATE, episode=2, frame=0, value=-np.inf)
    message = refusal(dataset)
    assert "'observation.state' is inf in episode 2, frame 0" in message and RECOLLECT in message


def test_a_header_shape_other_than_the_datas_names_both(dataset):
    edit_info(dataset, lambda info: info["features"][ACTION].update(shape=[9]))
    message = refusal(dataset)
    assert message == (f"{os.path.join(dataset, DATA)} holds 7 values a frame of 'action'; meta/info.json says its "
                       f"shape is [9] (9 values): fix features['action'] in meta/info.json to match the data, or "
                       f"{RECOLLECT}")


def test_a_header_dtype_of_another_kind_than_the_datas_names_both(dataset):
    edit_info(dataset, lambda info: info["features"][STATE].update(dtype="int64"))
    message = refusal(dataset)
    assert "holds float values of 'observation.state'; meta/info.json says its dtype is int64" in message


@pytest.mark.parametrize("count, wrong", [("total_frames", 99), ("total_episodes", 5)])
def test_header_counts_other_than_the_datas_are_refused(dataset, count, wrong):
    edit_info(dataset, lambda info: info.update({count: wrong}))
    message = refusal(dataset)
    right = EPISODES * LENGTH if count == "total_frames" else EPISODES
    assert message.startswith(f"{os.path.join(dataset, INFO)} says {count} {wrong}; meta/episodes lists 3 episodes "
                              f"of 18 frames, the data files hold 18 frames: fix {count} in meta/info.json to {right}")


@pytest.mark.parametrize("damage, said", [
    (lambda path: os.remove(path), "is missing (camera 'observation.images.main', episodes [0, 1, 2])"),
    (lambda path: open(path, "wb").write(np.random.default_rng(0).bytes(5000)), "cannot be read as a video"),
    (lambda path: open(path, "r+b").truncate(os.path.getsize(path) // 2), "cannot be read as a video"),
], ids=["missing", "garbage", "truncated"])
def test_a_missing_garbage_or_truncated_video_is_refused_at_start_up(dataset, damage, said):
    damage(os.path.join(dataset, VIDEO))
    message = refusal(dataset)
    assert message.startswith(f"{os.path.join(dataset, VIDEO)} {said}") and COPY_AGAIN in message


def test_a_video_cut_short_whose_index_still_lists_its_frames_is_refused(tmp_path):
    """LeRobot's files keep their index at the start: cut short, they still open and say how long
    they were; the last frame's packet is missing."""
    root = shutil.copytree(os.path.join(FIXTURES, "lerobot_dataset_tiny"), str(tmp_path / "lerobot"))
    video = os.path.join(root, VIDEO)
    os.chmod(video, 0o644)
    with open(video, "r+b") as f:
        f.truncate(os.path.getsize(video) * 9 // 10)
    with pytest.raises(DatasetError, match=f"{video} is truncated: it has no frame at 5.100 s, the last of episode 3"):
        check_video_files(DatasetReader(root))


def test_a_video_shorter_than_its_episodes_is_refused(dataset):
    path = os.path.join(dataset, VIDEO)
    os.remove(path)
    writer = VideoFileWriter(path, FPS, "av1", SIDE, SIDE)
    writer.add(np.zeros(((EPISODES - 1) * LENGTH, SIDE, SIDE, 3), np.uint8))  # the last episode left out
    writer.close()
    message = refusal(dataset)
    assert message.startswith(f"{path} lasts 0.600 s but episode 2 ends at 0.900 s in it") and COPY_AGAIN in message


def test_a_video_of_another_size_than_the_header_says_is_refused(dataset):
    edit_info(dataset, lambda info: info["features"][CAMERA].update(shape=[48, 48, 3]))
    message = refusal(dataset)
    assert message.startswith(f"{os.path.join(dataset, VIDEO)} is 32x32 (height x width); meta/info.json says camera "
                              "'observation.images.main' is 48x48")


def zero_the_pictures(path: str) -> None:
    """Every coded picture of the video at ``path`` overwritten by zeros, its container and index
    left whole: the start-up check passes, decoding fails."""
    with av.open(path) as container:
        packets = [(p.pos, p.size) for p in container.demux(container.streams.video[0]) if p.size]
    with open(path, "r+b") as f:
        for position, size in packets:
            f.seek(position)
            f.write(bytes(size))


def test_a_video_damaged_inside_is_refused_at_its_first_decode(dataset):
    path = os.path.join(dataset, VIDEO)
    zero_the_pictures(path)
    reader, _ = open_dataset(dataset, {}, SPEC)
    with pytest.raises(DatasetError) as refused:
        reader.episode_frames(CAMERA, 0)
    assert str(refused.value).startswith(f"{path}: no frame between 0.0000 s and 0.2500 s")
    assert "\n" not in str(refused.value) and COPY_AGAIN in str(refused.value)


@pytest.mark.slow  # starts a decoding process
def test_a_video_damaged_inside_found_by_a_decoding_process_is_refused_in_one_line(dataset):
    """torch re-raises a worker's error with the worker's traceback in its message; the stream
    raises the dataset's own one-line error instead."""
    path = os.path.join(dataset, VIDEO)
    zero_the_pictures(path)
    reader, keys = open_dataset(dataset, {}, SPEC)
    samples = SupervisedSamples(reader, keys, chunk=2, episodes=range(EPISODES))
    batches = batch_stream(samples, batch_size=4, seed=0, window_episodes=EPISODES, start_batch=0, rank=0,
                           world_size=1, num_workers=1)
    with pytest.raises(DatasetError) as refused:
        next(batches)
    assert str(refused.value).startswith(f"{path}: no frame between") and "\n" not in str(refused.value)


@pytest.mark.parametrize("damage, said", [
    (lambda root: edit_info(root, lambda info: info.update(codebase_version="v2.1")),
     "codebase_version 'v2.1'; this reader reads LeRobot's format v3.0 (convert an older dataset"),
    (lambda root: shutil.rmtree(os.path.join(root, "meta", "episodes")),
     "is not a LeRobot dataset: meta/episodes/ is missing (it says where each episode is): copy the whole dataset"),
    (lambda root: open(os.path.join(root, INFO), "w").write('{"fps": 20,'),
     f"{INFO} is damaged (Expecting property name enclosed in double quotes: line 1 column 12 (char 11)): fix it, "
     f"or {COPY_AGAIN}"),
], ids=["codebase_v2.1", "no_meta_episodes", "broken_info_json"])
def test_a_wrong_version_missing_episodes_or_broken_header_is_refused(dataset, damage, said):
    """Refused before: their messages now name the fix as well."""
    damage(dataset)
    assert said in refusal(dataset)


@pytest.mark.slow
def test_a_run_on_a_dataset_with_a_nan_action_stops_at_start_up_in_one_line(tmp_path):
    """The tiny OpenVLA SFT recipe on PushCube demonstrations with one NaN action: exit 2 and one
    line, before any training step (the NaN used to become an action token)."""
    from demonstrations import random_demonstrations, recipe_env_config  # Hydra, the envs: this test only

    root = random_demonstrations(str(tmp_path / "demos"), recipe_env_config("maniskill_sft_openvla_tiny"))
    set_value(root, ACTION, episode=2, frame=4, value=np.nan)
    entry = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
    proc = subprocess.run([sys.executable, entry, "--config-name", "maniskill_sft_openvla_tiny",
                           f"dataset.root={root}", f"runner.logger.log_path={tmp_path / 'run'}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dataset error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "'action' is nan in episode 2, frame 4" in lines[0] and RECOLLECT in lines[0]
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""  # no step trained
