"""Supervised batches from a dataset: the key mapping, action chunks padded past an episode's
end, a seeded order, and a dataset that does not fit the env refused by name."""

import os

import numpy as np
import pytest
from conftest import FIXTURES

from embodied_async.contracts import EnvSpec
from embodied_async.datasets.batches import (
    SupervisedSamples,
    batch_stream,
    check_against_spec,
    epoch_order,
    iterate_batch_indices,
    split_episodes,
)
from embodied_async.datasets.lerobot_format import DatasetError
from embodied_async.datasets.reader import DatasetReader

FIXTURE = os.path.join(FIXTURES, "lerobot_dataset_tiny")
KEYS = {"main_images": "observation.images.main", "wrist_images": "observation.images.wrist",
        "states": "observation.state", "actions": "action"}


@pytest.fixture(scope="module")
def reader():
    return DatasetReader(FIXTURE)


def spec(**changes):
    values = dict(obs_shapes={"main_images": (64, 64, 3), "wrist_images": (48, 40, 3), "states": (9,)},
                  obs_dtypes={"main_images": "uint8", "wrist_images": "uint8", "states": "float32"}, action_dim=7,
                  num_action_chunks=4)
    values.update(changes)
    return EnvSpec(**values)


def test_chunks_are_the_next_actions_padded_past_the_episode_end(reader):
    samples = SupervisedSamples(reader, KEYS, chunk=4, episodes=range(4))
    actions = reader.numbers["action"]
    # episode 0 is frames 0..11: frame 10 sees 10, 11, then 11 again (padded) twice
    batch = samples.batch(np.array([0, 10, 12]))
    np.testing.assert_array_equal(batch.actions[0], actions[0:4])
    np.testing.assert_array_equal(batch.actions[1], actions[[10, 11, 11, 11]])
    np.testing.assert_array_equal(batch.action_pad[1], [False, False, True, True])
    np.testing.assert_array_equal(batch.actions[2], actions[12:16])  # episode 1 starts at 12
    assert not batch.action_pad[[0, 2]].any()
    assert batch.obs["main_images"].shape == (3, 64, 64, 3) and batch.obs["main_images"].dtype == np.uint8
    assert batch.obs["wrist_images"].shape == (3, 48, 40, 3)
    np.testing.assert_array_equal(batch.obs["states"][2], reader.numbers["observation.state"][12])
    assert batch.obs["task_descriptions"] == ["push the cube to the goal", "push the cube to the goal",
                                              "pick up the red cube"]
    np.testing.assert_array_equal(batch.obs["main_images"][2], reader.frame(12)["observation.images.main"])


def test_the_order_is_seeded_and_covers_every_frame_once(reader):
    samples = SupervisedSamples(reader, KEYS, chunk=1, episodes=[0, 2, 3])
    a = epoch_order(samples, seed=5, epoch=0, window_episodes=2)
    assert sorted(a.tolist()) == sorted(set(range(0, 12)) | set(range(29, 38)) | set(range(38, 52)))
    np.testing.assert_array_equal(a, epoch_order(samples, seed=5, epoch=0, window_episodes=2))
    assert not np.array_equal(a, epoch_order(samples, seed=5, epoch=1, window_episodes=2))
    first = [b for _, b in zip(range(5), iterate_batch_indices(samples, 8, seed=1))]
    resumed = [b for _, b in zip(range(2), iterate_batch_indices(samples, 8, seed=1, start_batch=3))]
    assert all(len(b) == 8 for b in first) and len({tuple(b) for b in first}) == 5
    np.testing.assert_array_equal(first[3], resumed[0])
    np.testing.assert_array_equal(first[4], resumed[1])
    train, held = split_episodes(10, 0.2, seed=0)
    assert len(held) == 2 and sorted(train + held) == list(range(10))
    assert split_episodes(10, 0.2, seed=0) == (train, held)


def test_a_dataset_that_does_not_fit_is_refused_naming_the_key(reader):
    check_against_spec(reader, KEYS, spec(), control_hz=10)
    with pytest.raises(DatasetError, match="no such key; it has .*observation.state"):
        SupervisedSamples(reader, {**KEYS, "states": "observation.joints"}, 1, [0])
    with pytest.raises(DatasetError, match="\\['depth_images'\\], which no policy reads"):
        SupervisedSamples(reader, {**KEYS, "depth_images": "observation.images.main"}, 1, [0])
    with pytest.raises(DatasetError, match="takes 8 values"):
        check_against_spec(reader, KEYS, spec(action_dim=8), control_hz=10)
    with pytest.raises(DatasetError, match="shape \\[9\\]; the env's states is \\[10\\]"):
        check_against_spec(reader, KEYS, spec(obs_shapes={"main_images": (64, 64, 3), "wrist_images": (48, 40, 3),
                                                          "states": (10,)}), control_hz=10)
    with pytest.raises(DatasetError, match="recorded at 10 Hz \\(its header: 10 fps\\), the env acts at 20 Hz"):
        check_against_spec(reader, KEYS, spec(), control_hz=20)
    # a header whose fps is not the recording's rate (LIBERO's hub datasets): dataset.recorded_hz
    check_against_spec(reader, KEYS, spec(), control_hz=20, recorded_hz=20)
    with pytest.raises(DatasetError, match="recorded at 15 Hz \\(dataset.recorded_hz=15\\), the env acts at 20"):
        check_against_spec(reader, KEYS, spec(), control_hz=20, recorded_hz=15)
    no_wrist = {k: v for k, v in KEYS.items() if k != "wrist_images"}
    with pytest.raises(DatasetError, match="gives \\['wrist_images'\\] but dataset.keys maps no dataset key"):
        check_against_spec(reader, no_wrist, spec(), control_hz=10)


@pytest.mark.slow  # starts decoding worker processes
def test_decoding_workers_give_the_same_batches_in_the_same_order(reader):
    samples = SupervisedSamples(reader, KEYS, chunk=2, episodes=range(4))
    args = dict(batch_size=8, seed=3, window_episodes=2, start_batch=1, rank=1, world_size=2)
    here = [b for _, b in zip(range(4), batch_stream(samples, num_workers=0, **args))]
    workers = [b for _, b in zip(range(4), batch_stream(samples, num_workers=2, **args))]
    for a, b in zip(here, workers):
        assert len(a) == 4  # this rank's half of a batch of 8
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.obs["main_images"], b.obs["main_images"])
        assert a.obs["task_descriptions"] == b.obs["task_descriptions"]
