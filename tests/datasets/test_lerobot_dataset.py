"""LeRobot datasets (format v3.0) read and written: against the fixture LeRobot 0.4.4 wrote, and
round trips of our own writer."""

import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES

from embodied_async.datasets.lerobot_format import DEFAULT_FEATURES, DatasetError
from embodied_async.datasets.reader import DatasetReader, resolve_dataset
from embodied_async.datasets.writer import DatasetWriter

FIXTURE = os.path.join(FIXTURES, "lerobot_dataset_tiny")
EXPECTED = os.path.join(FIXTURES, "lerobot_dataset_tiny_expected")
TASKS = ["push the cube to the goal", "pick up the red cube"]
CAMERAS = ("main", "wrist")


@pytest.fixture(scope="module")
def raw():
    return dict(np.load(os.path.join(EXPECTED, "raw.npz")))


def fixture_features():
    with open(os.path.join(FIXTURE, "meta", "info.json")) as f:
        features = json.load(f)["features"]
    return {k: {kk: vv for kk, vv in v.items() if kk != "info"} for k, v in features.items()
            if k not in DEFAULT_FEATURES}


def episode(raw, e):
    return {"observation.images.main": raw[f"ep{e}_main"], "observation.images.wrist": raw[f"ep{e}_wrist"],
            "observation.state": raw[f"ep{e}_state"], "action": raw[f"ep{e}_action"]}


def write_fixture_episodes(root, raw, episodes=range(4), **kwargs):
    with DatasetWriter(root, 10, fixture_features(), robot_type="panda", **kwargs) as writer:
        for e in episodes:
            writer.add_episode(episode(raw, e), TASKS[e % 2], seed=100 + e)


def test_reads_the_dataset_lerobot_wrote_as_lerobot_reads_it(raw):
    expected = np.load(os.path.join(EXPECTED, "lerobot_decoded.npz"))
    reader = DatasetReader(FIXTURE)
    assert len(reader) == 52 and reader.num_episodes == 4 and reader.fps == 10
    assert reader.tasks == TASKS
    for key in ("index", "episode_index", "frame_index", "task_index"):
        np.testing.assert_array_equal(reader.numbers[key], expected[key])
    np.testing.assert_array_equal(reader.numbers["timestamp"], expected["timestamp"])
    lengths = [len(reader.episode_range(e)) for e in range(4)]
    assert lengths == [12, 17, 9, 14]
    for e in range(4):
        rows = reader.episode_range(e)
        np.testing.assert_array_equal(reader.numbers["observation.state"][rows.start:rows.stop], raw[f"ep{e}_state"])
        np.testing.assert_array_equal(reader.numbers["action"][rows.start:rows.stop], raw[f"ep{e}_action"])
        assert reader.episode_task(e) == TASKS[e % 2]
    for camera in CAMERAS:
        # LeRobot returns channels first; both decoders are dav1d through FFmpeg: within a level
        frames = np.stack([reader.frame(i)[f"observation.images.{camera}"] for i in range(52)])
        diff = np.abs(frames.transpose(0, 3, 1, 2).astype(int) - expected[camera].astype(int))
        assert diff.max() <= 2, (camera, diff.max())
    assert reader.stats["observation.state"]["mean"].shape == (9,)


def test_a_dataset_we_write_has_the_fixture_layout_and_schema(tmp_path, raw):
    root = str(tmp_path / "ours")
    write_fixture_episodes(root, raw)

    def files(folder):
        return sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names
                      if n != "README.md")

    assert files(root) == sorted(files(FIXTURE) + ["meta/collection.json"])
    with open(os.path.join(FIXTURE, "meta", "info.json")) as f:
        theirs = json.load(f)
    with open(os.path.join(root, "meta", "info.json")) as f:
        ours = json.load(f)
    assert ours == theirs
    for rel in ("meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet"):
        a, b = pq.read_schema(os.path.join(FIXTURE, rel)), pq.read_schema(os.path.join(root, rel))
        assert a.remove_metadata().equals(b.remove_metadata()), rel
    with open(os.path.join(FIXTURE, "meta", "stats.json")) as f:
        their_stats = json.load(f)
    with open(os.path.join(root, "meta", "stats.json")) as f:
        our_stats = json.load(f)
    assert set(our_stats) == set(their_stats)  # LeRobot orders them as a set happens to iterate
    for key, stats in their_stats.items():
        assert list(our_stats[key]) == list(stats), key
        for name, value in stats.items():
            assert np.shape(our_stats[key][name]) == np.shape(value), (key, name)
            assert type(np.ravel(our_stats[key][name])[0]) is type(np.ravel(value)[0]), (key, name)
    # same frames, same numbers: the statistics agree with LeRobot's where they are exact
    np.testing.assert_allclose(our_stats["observation.state"]["mean"], their_stats["observation.state"]["mean"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(our_stats["observation.state"]["min"], their_stats["observation.state"]["min"])


def test_what_we_write_reads_back(tmp_path, raw):
    root = str(tmp_path / "ours")
    write_fixture_episodes(root, raw)
    reader = DatasetReader(root)
    assert reader.tasks == TASKS and len(reader) == 52
    for e in range(4):
        rows = reader.episode_range(e)
        np.testing.assert_array_equal(reader.numbers["action"][rows.start:rows.stop], raw[f"ep{e}_action"])
        for camera in CAMERAS:
            frames = reader.episode_frames(f"observation.images.{camera}", e).astype(int)
            # AV1 is lossy: LeRobot's own files differ from these pictures by 3.1 levels on average
            assert np.abs(frames - raw[f"ep{e}_{camera}"]).mean() < 5.0
    with open(os.path.join(root, "meta", "collection.json")) as f:
        assert [ep["seed"] for ep in json.load(f)["episodes"]] == [100, 101, 102, 103]


def test_h264_videos_read_back(tmp_path, raw):
    root = str(tmp_path / "h264")
    features = fixture_features()
    features.pop("observation.images.wrist")
    with DatasetWriter(root, 10, features, video_codec="h264") as writer:
        frames = episode(raw, 0)
        frames.pop("observation.images.wrist")
        writer.add_episode(frames, TASKS[0])
    reader = DatasetReader(root)
    assert reader.features["observation.images.main"]["info"]["video.codec"] == "h264"
    decoded = reader.episode_frames("observation.images.main", 0).astype(int)
    assert np.abs(decoded - raw["ep0_main"]).mean() < 5.0


def test_appending_continues_indices_in_new_files(tmp_path, raw):
    root = str(tmp_path / "grown")
    write_fixture_episodes(root, raw, episodes=[0, 1], collection={"env": {"task": "a"}})
    write_fixture_episodes(root, raw, episodes=[2, 3], collection={"env": {"task": "a"}})
    reader = DatasetReader(root)
    assert reader.num_episodes == 4 and len(reader) == 52
    np.testing.assert_array_equal(reader.numbers["index"], np.arange(52))
    assert {int(r["data/file_index"]) for r in reader.episodes} == {0, 1}
    rows = reader.episode_range(3)
    np.testing.assert_array_equal(reader.numbers["observation.state"][rows.start:rows.stop], raw["ep3_state"])
    assert np.abs(reader.episode_frames("observation.images.wrist", 3).astype(int) - raw["ep3_wrist"]).mean() < 5
    with pytest.raises(DatasetError, match="another env config.*task"):
        write_fixture_episodes(root, raw, episodes=[0], collection={"env": {"task": "b"}})
    with pytest.raises(DatasetError, match="at 10 fps"):
        DatasetWriter(root, 20, fixture_features())


def test_segments_are_finished_as_they_fill(tmp_path, raw):
    """A writer that dies mid-way keeps the segments it finished."""
    root = str(tmp_path / "partial")
    writer = DatasetWriter(root, 10, fixture_features(), episodes_per_file=2)
    for e in range(3):
        writer.add_episode(episode(raw, e), TASKS[e % 2])
    # not closed: the third episode is lost, the first two are a complete dataset
    assert DatasetReader(root).num_episodes == 2


def test_bad_datasets_are_named(tmp_path):
    with pytest.raises(DatasetError, match="not a LeRobot dataset: meta/info.json is missing"):
        DatasetReader(str(tmp_path))
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURE, broken)
    data = broken / "data" / "chunk-000" / "file-000.parquet"
    os.chmod(data, 0o644)
    data.write_bytes(data.read_bytes()[:200])
    with pytest.raises(DatasetError, match="file-000.parquet"):
        DatasetReader(str(broken))
    damaged = tmp_path / "damaged"
    shutil.copytree(FIXTURE, damaged)
    video = damaged / "videos" / "observation.images.main" / "chunk-000" / "file-000.mp4"
    os.chmod(video, 0o644)
    video.write_bytes(video.read_bytes()[:1500])
    reader = DatasetReader(str(damaged))
    with pytest.raises(ValueError, match="observation.images.main/chunk-000/file-000.mp4"):
        reader.episode_frames("observation.images.main", 3)
    with pytest.raises(DatasetError, match="neither a dataset folder nor a Hugging Face repo id"):
        resolve_dataset(str(tmp_path / "nowhere"))


def test_a_hub_repo_id_offline_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DatasetError, match="hf download someone/demos --repo-type dataset"):
        resolve_dataset("someone/demos")


@pytest.mark.parametrize("shape, stored, described", [
    ([1], "float", {"dtype": "float32", "_type": "Value"}),  # LeRobot stores shape (1,) as a value
    ([3], "fixed_size_list<element: float>[3]", {"feature": {"dtype": "float32", "_type": "Value"}, "length": 3,
                                                  "_type": "List"}),
])
def test_a_feature_is_stored_as_lerobots_feature_typing_says(tmp_path, shape, stored, described):
    """LeRobot types a feature of shape (1,) as a value and a longer vector as a list (its
    datasets fail to load a list of one where info.json says (1,): 'Couldn't cast array of type
    fixed_size_list<element: float>[1] to float'); each is read back as [N, *shape]."""
    root = str(tmp_path / "one_value")
    values = np.arange(5 * int(np.prod(shape)), dtype=np.float32).reshape(5, *shape)
    features = {"observation.state": {"dtype": "float32", "shape": shape}, "action": {"dtype": "float32", "shape": [2]}}
    with DatasetWriter(root, 10, features) as writer:
        writer.add_episode({"observation.state": values, "action": np.zeros((5, 2), np.float32)}, "hold")
    table = pq.read_table(os.path.join(root, "data", "chunk-000", "file-000.parquet"))
    assert str(table.schema.field("observation.state").type) == stored
    hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.state"] == described
    np.testing.assert_array_equal(DatasetReader(root).numbers["observation.state"], values)


def test_a_one_value_feature_written_as_a_list_of_one_still_reads(tmp_path):
    """Datasets written before (a list of one per frame) read as before."""
    import pyarrow as pa

    root = str(tmp_path / "older")
    values = np.arange(5, dtype=np.float32).reshape(5, 1)
    features = {"observation.state": {"dtype": "float32", "shape": [1]}, "action": {"dtype": "float32", "shape": [2]}}
    with DatasetWriter(root, 10, features) as writer:
        writer.add_episode({"observation.state": values, "action": np.zeros((5, 2), np.float32)}, "hold")
    path = os.path.join(root, "data", "chunk-000", "file-000.parquet")
    table = pq.read_table(path)
    as_list = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 1)
    column = table.schema.get_field_index("observation.state")
    pq.write_table(table.set_column(column, "observation.state", as_list), path)
    assert pa.types.is_fixed_size_list(pq.read_table(path).schema.field("observation.state").type)
    np.testing.assert_array_equal(DatasetReader(root).numbers["observation.state"], values)
