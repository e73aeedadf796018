"""Writing episodes as a LeRobot dataset (format v3.0), new or appended to.

Episodes are written in segments of ``episodes_per_file``: each segment gets its own data
parquet, one mp4 per camera and its rows in ``meta/episodes``, and the dataset's metadata
(tasks, statistics, counts) is rewritten atomically after it. A crash or Ctrl-C loses at most the
segment being written; ``close`` (or leaving the ``with`` block, also on an exception) finishes
the episodes already added.
"""

from __future__ import annotations

import copy
import os
from typing import Dict, List, Optional

import numpy as np

from embodied_async.datasets import lerobot_format as fmt
from embodied_async.datasets.stats import STAT_NAMES, feature_stats, from_json, merge_stats, to_json
from embodied_async.datasets.video import VideoFileWriter, video_feature_info


class DatasetWriter:
    """``features``: the dataset's own features as LeRobot declares them, e.g.
    ``{"observation.images.main": {"dtype": "video", "shape": [64, 64, 3], "names": [...]},
    "observation.state": {"dtype": "float32", "shape": [9], "names": None}, "action": ...}``.
    ``collection``: what to keep in ``meta/collection.json`` (the env config the episodes were
    collected in); appending to a dataset requires the same fps, features and collection env."""

    def __init__(self, root: str, fps: int, features: Dict[str, dict], robot_type: Optional[str] = None,
                 video_codec: str = "av1", collection: Optional[dict] = None, episodes_per_file: int = 100):
        fmt.check_features(features)
        self.root, self.fps, self.codec = root, int(fps), video_codec
        self.episodes_per_file = max(1, int(episodes_per_file))
        features = copy.deepcopy(features)
        for key in fmt.video_keys(features):
            height, width, _ = features[key]["shape"]
            features[key].setdefault("names", ["height", "width", "channels"])
            features[key]["info"] = video_feature_info(video_codec, int(height), int(width), self.fps)
        for feature in features.values():
            feature.setdefault("names", None)
        self.collection = dict(collection or {})
        self.collection.setdefault("episodes", [])
        if os.path.isfile(os.path.join(root, fmt.INFO_PATH)):
            self._open_existing(features)
        else:
            self.info = fmt.make_info(self.fps, features, robot_type)
            self.tasks: List[str] = []
            self.stats: Dict[str, Dict[str, np.ndarray]] = {}
            self.next_file = 0
        self.features = self.info["features"]
        self._segment_rows: List[dict] = []
        self._numbers: Dict[str, List[np.ndarray]] = {}
        self._videos: Dict[str, VideoFileWriter] = {}

    # ---- opening ---------------------------------------------------------------------------
    def _open_existing(self, features: Dict[str, dict]) -> None:
        info = fmt.read_info(self.root)
        if int(info["fps"]) != self.fps:
            raise fmt.DatasetError(f"{self.root} holds episodes at {info['fps']} fps; these are at {self.fps} fps: "
                                   "write them to another dataset")
        theirs = {k: (f["dtype"], list(f["shape"])) for k, f in info["features"].items()}
        ours = {k: (f["dtype"], list(f["shape"])) for k, f in {**features, **fmt.DEFAULT_FEATURES}.items()}
        if theirs != ours:
            differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise fmt.DatasetError(f"{self.root} has other features than these episodes (differing: {differ}; the "
                                   f"dataset has {sorted(theirs)}): write them to another dataset")
        stored = fmt.read_json(self.root, fmt.COLLECTION_PATH) if os.path.isfile(
            os.path.join(self.root, fmt.COLLECTION_PATH)) else {"episodes": []}
        self._check_same_env(stored.get("env"), self.collection.get("env"))
        self.collection = {**self.collection, "episodes": stored.get("episodes", [])}
        self.info, self.tasks = info, fmt.read_tasks(self.root)
        episodes = fmt.read_episodes(self.root)
        self.stats = from_json(fmt.read_json(self.root, fmt.STATS_PATH)) if episodes else {}
        used = [fmt.file_counter(r["data/chunk_index"], r["data/file_index"]) for r in episodes]
        self.next_file = max(used, default=-1) + 1
        self.info["total_episodes"] = len(episodes)
        self.info["total_frames"] = sum(int(r["length"]) for r in episodes)

    def _check_same_env(self, stored: Optional[dict], new: Optional[dict]) -> None:
        if stored is None or new is None or stored == new:
            return
        keys = sorted(k for k in set(stored) | set(new) if stored.get(k) != new.get(k))
        raise fmt.DatasetError(f"{self.root} was collected in another env config (differing keys: "
                               + ", ".join(f"{k}: {stored.get(k)!r} there, {new.get(k)!r} here" for k in keys[:6])
                               + "): write these episodes to another dataset")

    # ---- adding episodes ---------------------------------------------------------------------
    @property
    def total_episodes(self) -> int:
        return int(self.info["total_episodes"]) + len(self._segment_rows)

    @property
    def total_frames(self) -> int:
        return int(self.info["total_frames"]) + sum(int(r["length"]) for r in self._segment_rows)

    def add_episode(self, frames: Dict[str, np.ndarray], task: str, **episode_info) -> int:
        """Add one episode: every feature's values ``[T, ...]`` (uint8 ``[T, H, W, 3]`` for
        videos), its task (instruction) and anything to keep about it in ``collection.json``
        (e.g. ``seed=...``). Returns its episode index."""
        length = self._check_episode(frames)
        episode_index = self.total_episodes
        if task not in self.tasks:
            self.tasks.append(task)
        first_index = self.total_frames
        columns = {k: np.asarray(frames[k]).reshape(length, -1).astype(self.features[k]["dtype"])
                   for k in fmt.number_keys(self.features)}
        columns.update(timestamp=(np.arange(length) / self.fps).astype(np.float32),
                       frame_index=np.arange(length, dtype=np.int64),
                       episode_index=np.full(length, episode_index, dtype=np.int64),
                       index=np.arange(first_index, first_index + length, dtype=np.int64),
                       task_index=np.full(length, self.tasks.index(task), dtype=np.int64))
        for key, values in columns.items():
            self._numbers.setdefault(key, []).append(values)
        location = fmt.file_location(self.next_file)
        row = {"episode_index": episode_index, "tasks": [task], "length": length,
               "data/chunk_index": location["chunk_index"], "data/file_index": location["file_index"],
               "dataset_from_index": first_index, "dataset_to_index": first_index + length}
        for key in fmt.video_keys(self.features):
            row.update(self._add_video(key, np.asarray(frames[key]), location))
        episode_stats = {key: feature_stats(columns[key] if key in columns else np.asarray(frames[key]),
                                            is_image=self.features[key]["dtype"] == "video")
                         for key in self.features}
        for key, stats in episode_stats.items():
            row.update({f"stats/{key}/{name}": np.asarray(v).tolist() for name, v in stats.items()})
        row.update({"meta/episodes/chunk_index": location["chunk_index"],
                    "meta/episodes/file_index": location["file_index"]})
        self._segment_rows.append(row)
        self.collection["episodes"].append({"episode_index": episode_index, **episode_info})
        if len(self._segment_rows) >= self.episodes_per_file:
            self._finish_segment()
        return episode_index

    def _check_episode(self, frames: Dict[str, np.ndarray]) -> int:
        expected = set(fmt.video_keys(self.features)) | set(fmt.number_keys(self.features))
        if set(frames) != expected:
            raise fmt.DatasetError(f"an episode must give exactly the dataset's features {sorted(expected)}; got "
                                   f"{sorted(frames)}")
        lengths = {k: len(v) for k, v in frames.items()}
        if len(set(lengths.values())) != 1 or not next(iter(lengths.values())):
            raise fmt.DatasetError(f"an episode's features must have the same, non-zero number of frames: {lengths}")
        for key, values in frames.items():
            shape = tuple(self.features[key]["shape"])
            got = tuple(np.shape(values)[1:])
            if got != shape and not (shape == (1,) and got == ()):
                raise fmt.DatasetError(f"feature {key!r}: each frame is {list(shape)}, got {list(got)}")
        return next(iter(lengths.values()))

    def _add_video(self, key: str, frames: np.ndarray, location: Dict[str, int]) -> dict:
        if key not in self._videos:
            height, width, _ = self.features[key]["shape"]
            path = os.path.join(self.root, fmt.VIDEO_PATH.format(video_key=key, **location))
            self._videos[key] = VideoFileWriter(path, self.fps, self.codec, int(height), int(width))
        writer = self._videos[key]
        start = writer.frames_written / self.fps
        writer.add(frames)
        return {f"videos/{key}/chunk_index": location["chunk_index"], f"videos/{key}/file_index":
                location["file_index"], f"videos/{key}/from_timestamp": start,
                f"videos/{key}/to_timestamp": writer.frames_written / self.fps}

    # ---- finishing ---------------------------------------------------------------------------
    def _finish_segment(self) -> None:
        """Files of the segment first, the metadata that points at them last (each atomically)."""
        import pyarrow as pa

        if not self._segment_rows:
            return
        for writer in self._videos.values():
            writer.close()
        location = fmt.file_location(self.next_file)
        schema, _ = fmt.data_columns(self.features)
        data = {k: np.concatenate(v) for k, v in self._numbers.items()}
        arrays = [pa.FixedSizeListArray.from_arrays(pa.array(data[f.name].reshape(-1)), f.type.list_size)
                  if pa.types.is_fixed_size_list(f.type) else pa.array(data[f.name].reshape(-1), type=f.type)
                  for f in schema]
        fmt.write_table(self.root, fmt.DATA_PATH.format(**location), pa.Table.from_arrays(arrays, schema=schema))
        fmt.write_table(self.root, fmt.EPISODES_PATH.format(**location), pa.Table.from_pylist(self._segment_rows))
        new_stats = [from_json({k: {n: row[f"stats/{k}/{n}"] for n in STAT_NAMES} for k in self.features})
                     for row in self._segment_rows]
        self.stats = {key: merge_stats(([self.stats[key]] if key in self.stats else [])
                                       + [s[key] for s in new_stats]) for key in self.features}
        self.info["total_episodes"] = self.total_episodes
        self.info["total_frames"] += sum(int(r["length"]) for r in self._segment_rows)
        self.info["total_tasks"] = len(self.tasks)
        self.info["splits"] = {"train": f"0:{self.info['total_episodes']}"}
        fmt.write_table(self.root, fmt.TASKS_PATH, fmt.tasks_table(self.tasks))
        fmt.write_json(self.root, fmt.STATS_PATH, to_json(self.stats))
        fmt.write_json(self.root, fmt.COLLECTION_PATH, self.collection)
        fmt.write_json(self.root, fmt.INFO_PATH, self.info)
        self._segment_rows, self._numbers, self._videos = [], {}, {}
        self.next_file += 1

    def close(self) -> None:
        self._finish_segment()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
