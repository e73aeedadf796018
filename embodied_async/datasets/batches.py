"""From a dataset's frames to a policy's supervised batches: which dataset key feeds which
policy input, action chunks with their pad mask, and a shuffled, seeded order of frames.

A batch holds observations as the env would give them (``main_images`` / ``wrist_images`` uint8
``[B, H, W, 3]``, ``states`` float32 ``[B, D]``, ``task_descriptions``) and the expert's next
``C`` actions ``[B, C, A]`` from each frame on; past the episode's end the last action is repeated
and ``action_pad`` is True there (LeRobot's padding), so a loss can leave those out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch.utils.data

from embodied_async.datasets.integrity import check_finite, check_video_files
from embodied_async.datasets.lerobot_format import DatasetError
from embodied_async.datasets.reader import DatasetReader

# the policy inputs a dataset key may feed, and what the dataset must hold for each
IMAGE_INPUTS = ("main_images", "wrist_images")
VECTOR_INPUTS = ("states", "actions")
POLICY_INPUTS = IMAGE_INPUTS + VECTOR_INPUTS
# the dataset keys LeRobot's conventions (and our collector) give each input
CONVENTIONAL_KEYS = {"main_images": "observation.images.main", "wrist_images": "observation.images.wrist",
                     "states": "observation.state", "actions": "action"}


def dataset_features(spec) -> Dict[str, dict]:
    """The LeRobot features that record what an env with ``spec`` shows a policy, under the
    conventional keys: its cameras as videos, its states, and the executed actions."""
    features: Dict[str, dict] = {}
    for name in POLICY_INPUTS:
        if name == "actions":
            features[CONVENTIONAL_KEYS[name]] = {"dtype": "float32", "shape": [int(spec.action_dim)], "names": None}
        elif name in spec.obs_shapes:
            shape = [int(v) for v in spec.obs_shapes[name]]
            features[CONVENTIONAL_KEYS[name]] = {"dtype": "video", "shape": shape} if name in IMAGE_INPUTS \
                else {"dtype": "float32", "shape": shape, "names": None}
    return features


def resolve_keys(reader: DatasetReader, keys: Dict[str, Optional[str]], spec) -> Dict[str, str]:
    """The mapping a run uses: the conventional key of every input the env gives (and of the
    actions) where the dataset has it, then ``keys`` on top (an input mapped to None is left out)."""
    wanted = set(spec.obs_shapes) | {"actions"}
    resolved = {name: key for name, key in CONVENTIONAL_KEYS.items() if name in wanted and key in reader.features}
    for name, key in keys.items():
        if key is None:
            resolved.pop(name, None)
        else:
            resolved[name] = key
    return resolved


@dataclass
class SupervisedBatch:
    obs: Dict[str, object]
    actions: np.ndarray  # float32 [B, C, A]
    action_pad: np.ndarray  # bool [B, C]: True past the episode's end

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def rows(self, index) -> "SupervisedBatch":
        obs = {k: (v[index] if k != "task_descriptions" else list(np.asarray(v, dtype=object)[index]))
               for k, v in self.obs.items()}
        return SupervisedBatch(obs=obs, actions=self.actions[index], action_pad=self.action_pad[index])


def check_mapping(reader: DatasetReader, keys: Dict[str, str]) -> None:
    """Every mapped input is one we know, every dataset key exists with the right kind."""
    have = sorted(reader.features)
    unknown = sorted(set(keys) - set(POLICY_INPUTS))
    if unknown:
        raise DatasetError(f"dataset.keys names {unknown}, which no policy reads; the inputs are {list(POLICY_INPUTS)}")
    if "actions" not in keys:
        raise DatasetError(f"dataset.keys has no 'actions' entry: name the dataset key of the expert's actions (the "
                           f"dataset has {have})")
    for name, key in keys.items():
        if key not in reader.features:
            raise DatasetError(f"dataset.keys.{name}={key!r}: the dataset {reader.root} has no such key; it has {have}")
        is_video = reader.features[key]["dtype"] == "video"
        if (name in IMAGE_INPUTS) != is_video:
            kind = "a camera (dtype video)" if name in IMAGE_INPUTS else "a vector of numbers"
            raise DatasetError(f"dataset.keys.{name}={key!r} must be {kind}; it is {reader.features[key]['dtype']}")


def check_against_spec(reader: DatasetReader, keys: Dict[str, str], spec, control_hz: Optional[float],
                       recorded_hz: Optional[float] = None) -> None:
    """The dataset fits the env the policy acts in: shapes of cameras and states, the action size,
    and the frame rate (the env's control rate, where the env says it; ``recorded_hz`` in place of
    the header's fps, where the header's is not the rate its frames were recorded at)."""
    for name, key in keys.items():
        shape = [int(s) for s in reader.features[key]["shape"]]
        if name == "actions":
            if shape != [spec.action_dim]:
                raise DatasetError(f"dataset key {key!r} holds actions of shape {shape}; the env takes "
                                   f"{spec.action_dim} values per action")
            continue
        if name not in spec.obs_shapes:
            raise DatasetError(f"dataset.keys.{name}={key!r}, but the env gives no {name!r} (it gives "
                               f"{sorted(spec.obs_shapes)}): drop the entry or use an env config with it")
        if tuple(shape) != tuple(spec.obs_shapes[name]):
            raise DatasetError(f"dataset key {key!r} has shape {shape}; the env's {name} is "
                               f"{list(spec.obs_shapes[name])}: collect with the same camera size / state layout")
    missing = [n for n in spec.obs_shapes if n in POLICY_INPUTS and n not in keys]
    if missing:
        raise DatasetError(f"the env gives {missing} but dataset.keys maps no dataset key to it (the dataset has "
                           f"{sorted(reader.features)})")
    rate = reader.fps if recorded_hz is None else float(recorded_hz)
    if control_hz is not None and abs(float(control_hz) - rate) > 1e-6:
        said = f"dataset.recorded_hz={rate:g}" if recorded_hz is not None else f"its header: {reader.fps} fps"
        raise DatasetError(f"the dataset {reader.root} was recorded at {rate:g} Hz ({said}), the env acts at "
                           f"{control_hz:g} Hz: a policy trained on it would act at the wrong speed; collect at the "
                           "env's rate, or set dataset.recorded_hz where the header's fps is not the recording's rate")


def open_dataset(root: str, keys: Dict[str, Optional[str]], spec, cache_episodes: int = 64,
                 recorded_hz: Optional[float] = None, check_videos: bool = True) -> tuple:
    """(reader, resolved key mapping) of the dataset at ``root`` (a folder or hub repo id), checked
    against itself (the reader: its header; here: the values the run reads are finite, and with
    ``check_videos`` its video files) and against the env's ``spec``: the one place a run opens its
    dataset. The launcher checks the videos once; trainer ranks and the batch-making processes
    read a dataset it checked (a hub dataset's thousands of files are not opened on every rank)."""
    from embodied_async.datasets.reader import resolve_dataset

    reader = DatasetReader(resolve_dataset(root, "dataset.root"), cache_episodes=cache_episodes)
    if check_videos:
        check_video_files(reader)
    resolved = resolve_keys(reader, dict(keys), spec)
    check_finite(reader, resolved.values())
    check_mapping(reader, resolved)
    check_against_spec(reader, resolved, spec, spec.control_hz, recorded_hz)
    return reader, resolved


class SupervisedSamples:
    """Frames of some episodes of a dataset as supervised samples with ``chunk`` actions each."""

    def __init__(self, reader: DatasetReader, keys: Dict[str, str], chunk: int, episodes: Sequence[int]):
        check_mapping(reader, keys)
        self.reader, self.keys, self.chunk = reader, dict(keys), int(chunk)
        self.episodes = list(episodes)
        self.episode_end = np.zeros(len(reader), dtype=np.int64)
        for e in range(reader.num_episodes):
            rows = reader.episode_range(e)
            self.episode_end[rows.start:rows.stop] = rows.stop

    def frames(self, episode: int) -> range:
        return self.reader.episode_range(episode)

    @property
    def num_frames(self) -> int:
        return sum(len(self.frames(e)) for e in self.episodes)

    def batch(self, indices: np.ndarray) -> SupervisedBatch:
        reader, indices = self.reader, np.asarray(indices, dtype=np.int64)
        ahead = indices[:, None] + np.arange(self.chunk)[None, :]
        last = self.episode_end[indices][:, None] - 1
        pad = ahead > last
        actions = reader.numbers[self.keys["actions"]][np.minimum(ahead, last)].astype(np.float32)
        obs: Dict[str, object] = {"task_descriptions": [reader.tasks[int(t)] for t in
                                                        reader.numbers["task_index"][indices]]}
        if "states" in self.keys:
            obs["states"] = reader.numbers[self.keys["states"]][indices].astype(np.float32)
        for name in IMAGE_INPUTS:
            if name in self.keys:
                obs[name] = np.stack([self._image(self.keys[name], int(i)) for i in indices])
        return SupervisedBatch(obs=obs, actions=actions, action_pad=pad)

    def _image(self, key: str, index: int) -> np.ndarray:
        episode = int(self.reader.numbers["episode_index"][index])
        return self.reader.episode_frames(key, episode)[index - self.reader.episode_range(episode).start]


def split_episodes(num_episodes: int, validation_fraction: float, seed: int) -> tuple:
    """(training episodes, held-out episodes): a seeded draw of whole episodes, at least one of
    each when there are two or more episodes and the fraction is positive."""
    order = np.random.default_rng(seed).permutation(num_episodes)
    held = int(round(num_episodes * validation_fraction))
    if validation_fraction > 0 and num_episodes >= 2:
        held = min(max(held, 1), num_episodes - 1)
    return sorted(order[held:].tolist()), sorted(order[:held].tolist())


def epoch_order(samples: SupervisedSamples, seed: int, epoch: int, window_episodes: int) -> np.ndarray:
    """Every frame of the samples' episodes once, shuffled within windows of episodes.

    Episodes are shuffled, taken ``window_episodes`` at a time, and the frames of a window are
    shuffled together: a batch mixes many episodes while decoding touches only a window's videos
    at a time (the reader keeps them cached). Deterministic in (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    episodes = [samples.episodes[i] for i in rng.permutation(len(samples.episodes))]
    out: List[np.ndarray] = []
    for start in range(0, len(episodes), window_episodes):
        frames = np.concatenate([np.arange(samples.frames(e).start, samples.frames(e).stop)
                                 for e in episodes[start:start + window_episodes]])
        out.append(frames[rng.permutation(len(frames))])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def iterate_batch_indices(samples: SupervisedSamples, batch_size: int, seed: int, window_episodes: int = 32,
                          start_batch: int = 0) -> Iterator[np.ndarray]:
    """The frame indices of batches of ``batch_size`` forever, epoch after epoch; ``start_batch``
    skips ahead (a resumed run continues the same sequence). The last incomplete batch of an
    epoch is dropped so every batch has the same size (every trainer rank then runs as many
    forward passes as the others)."""
    per_epoch = samples.num_frames // batch_size
    if per_epoch == 0:
        raise DatasetError(f"the episodes hold {samples.num_frames} frames, fewer than one batch of {batch_size}: "
                           "lower actor.global_batch_size or collect more episodes")
    epoch, skip = divmod(start_batch, per_epoch)
    while True:
        order = epoch_order(samples, seed, epoch, window_episodes)
        for b in range(skip, per_epoch):
            yield order[b * batch_size:(b + 1) * batch_size]
        epoch, skip = epoch + 1, 0


class _BatchStream(torch.utils.data.IterableDataset):
    """Batches made in a worker process: batch ``b`` of the sequence by worker ``b % workers``
    (torch's DataLoader then hands them out in order, so the sequence is the same as without
    workers). Picklable: each worker process opens the dataset again (its own decoded cache)."""

    def __init__(self, root: str, keys: Dict[str, str], chunk: int, episodes: Sequence[int], batch_size: int,
                 seed: int, window_episodes: int, start_batch: int, rank: int, world_size: int, cache: int):
        self.args = (root, keys, chunk, list(episodes), batch_size, seed, window_episodes, start_batch, rank,
                     world_size, cache)

    def __iter__(self):
        root, keys, chunk, episodes, batch_size, seed, window, start, rank, world, cache = self.args
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        samples = SupervisedSamples(DatasetReader(root, cache_episodes=cache), keys, chunk, episodes)
        indices = iterate_batch_indices(samples, batch_size, seed, window, start_batch=start)
        for number, batch in enumerate(indices):
            if number % workers == worker:
                try:
                    yield samples.batch(batch[rank::world])
                except DatasetError as err:
                    # handed over as an item, raised as it is by batch_stream: raised here, torch
                    # would re-raise it with this process's traceback inside its message
                    yield err
                    return


def _as_is(item):
    return item


def batch_stream(samples: SupervisedSamples, batch_size: int, seed: int, window_episodes: int, start_batch: int,
                 rank: int, world_size: int, num_workers: int) -> Iterator[SupervisedBatch]:
    """This rank's share of each global batch, forever: made here, or by ``num_workers``
    processes ahead of time (when decoding video is what the step waits for)."""
    if num_workers == 0:
        for indices in iterate_batch_indices(samples, batch_size, seed, window_episodes, start_batch=start_batch):
            yield samples.batch(indices[rank::world_size])
        return
    stream = _BatchStream(samples.reader.root, samples.keys, samples.chunk, samples.episodes, batch_size, seed,
                          window_episodes, start_batch, rank, world_size, samples.reader.cache_episodes)
    # spawn: the trainer is a Ray worker with threads of its own, which a fork would copy half-way
    for batch in torch.utils.data.DataLoader(stream, batch_size=None, num_workers=num_workers, collate_fn=_as_is,
                                             multiprocessing_context="spawn", prefetch_factor=2,
                                             persistent_workers=False):
        if isinstance(batch, DatasetError):  # a file damaged inside, found at its first decode there
            raise batch
        yield batch
