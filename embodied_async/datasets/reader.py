"""Reading a LeRobot dataset (format v3.0), written by LeRobot or by us, from a local folder or a
Hugging Face dataset repo.

``DatasetReader`` loads every frame's numbers at once (they are small) and decodes camera frames
an episode at a time, keeping the last ``cache_episodes`` decoded: training draws its batches
from a window of episodes at a time (``batches.py``), so each episode is decoded about once per
pass over the data.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Dict, List, Optional

import numpy as np

from embodied_async.datasets import lerobot_format as fmt
from embodied_async.datasets.integrity import check_column, check_totals
from embodied_async.datasets.stats import feature_stats, from_json, merge_stats
from embodied_async.datasets.video import decode_frames

HUB_REPO_ID_PARTS = 2


def resolve_dataset(path: str, key: str = "dataset.root") -> str:
    """A local dataset folder as it is; an ``owner/name`` repo id: its copy in the Hugging Face
    cache, else downloaded there (one line naming the command to run where the hub is reachable
    when it cannot be)."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return local
    if path.startswith(("/", ".", "~")) or len(path.split("/")) != HUB_REPO_ID_PARTS:
        raise fmt.DatasetError(f"{key}={path!r} is neither a dataset folder nor a Hugging Face repo id "
                               "('owner/name'): fix the path (relative to the working directory)")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id=path, repo_type="dataset", local_files_only=True)
    except Exception:  # noqa: BLE001  (not cached: download below)
        pass
    try:
        return snapshot_download(repo_id=path, repo_type="dataset")
    except Exception as err:  # noqa: BLE001  (offline, unknown or gated repo)
        first = str(err).splitlines()[0][:200] if str(err) else "no detail"
        raise fmt.DatasetError(f"could not get the dataset '{path}' from the Hugging Face hub ({type(err).__name__}: "
                               f"{first}). On a machine with access run:  hf download {path} --repo-type dataset  "
                               f"(then copy the hub cache, ~/.cache/huggingface, here, or set {key} to the "
                               "downloaded folder)") from err


class DatasetReader:
    def __init__(self, root: str, cache_episodes: int = 64):
        self.root = root
        self.info = fmt.read_info(root)
        self.fps = int(self.info["fps"])
        self.features: Dict[str, dict] = self.info["features"]
        self.video_keys = fmt.video_keys(self.features)
        self.tasks = fmt.read_tasks(root)
        self.episodes = fmt.read_episodes(root)
        self.numbers = self._load_numbers()
        self._check_episodes()
        check_totals(self)
        self._cache: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
        self.cache_episodes = cache_episodes
        self._stats: Optional[Dict[str, Dict[str, np.ndarray]]] = None

    # ---- loading -------------------------------------------------------------------------------
    def _load_numbers(self) -> Dict[str, np.ndarray]:
        """Every frame's numeric columns, ordered by the global frame index."""
        files = sorted({(int(r["data/chunk_index"]), int(r["data/file_index"])) for r in self.episodes})
        parts: Dict[str, List[np.ndarray]] = {}
        keys = [k for k, f in self.features.items() if f["dtype"] != "video"]
        for chunk_index, file_index in files:
            rel = fmt.DATA_PATH.format(chunk_index=chunk_index, file_index=file_index)
            table = fmt.read_table(self.root, rel)
            missing = [k for k in keys if k not in table.column_names]
            if missing:
                raise fmt.DatasetError(f"{os.path.join(self.root, rel)} lacks the columns {missing} that "
                                       f"meta/info.json declares (it has {table.column_names}): fix the features "
                                       f"in meta/info.json, or {fmt.FIX_RECOLLECT}")
            for key in keys:
                check_column(os.path.join(self.root, rel), key, self.features[key], table.column(key))
                parts.setdefault(key, []).append(_column(table, key, self.features[key]))
        numbers = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(numbers["index"], kind="stable")
        return {k: v[order] for k, v in numbers.items()}

    def _check_episodes(self) -> None:
        index = self.numbers["index"]
        if not np.array_equal(index, np.arange(len(index))):
            raise fmt.DatasetError(f"{self.root}: the frames' index column is not 0..{len(index) - 1}: a data file "
                                   f"is missing, doubled or damaged: {fmt.FIX_RECOLLECT}")
        for row in self.episodes:
            start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
            frames = self.numbers["episode_index"][start:stop]
            if stop - start != int(row["length"]) or not np.all(frames == row["episode_index"]):
                raise fmt.DatasetError(f"{self.root}: episode {row['episode_index']}'s rows {start}..{stop} in "
                                       f"meta/episodes do not match the data files: {fmt.FIX_RECOLLECT}")
            missing = [k for k in self.video_keys if f"videos/{k}/from_timestamp" not in row]
            if missing:
                raise fmt.DatasetError(f"{self.root}: meta/episodes has no video location of {missing} for "
                                       f"episode {row['episode_index']}: copy the whole dataset folder again, or "
                                       f"{fmt.FIX_RECOLLECT}")

    # ---- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(len(self.numbers["index"]))

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def episode_range(self, episode: int) -> range:
        row = self.episodes[episode]
        return range(int(row["dataset_from_index"]), int(row["dataset_to_index"]))

    def episode_task(self, episode: int) -> str:
        start = self.episode_range(episode).start
        return self.tasks[int(self.numbers["task_index"][start])]

    def video_path(self, key: str, episode: int) -> str:
        row = self.episodes[episode]
        return os.path.join(self.root, self.info.get("video_path", fmt.VIDEO_PATH).format(
            video_key=key, chunk_index=int(row[f"videos/{key}/chunk_index"]),
            file_index=int(row[f"videos/{key}/file_index"])))

    def episode_frames(self, key: str, episode: int) -> np.ndarray:
        """uint8 ``[T, H, W, 3]``: camera ``key`` over the whole episode (decoded once, cached)."""
        cache_key = (key, episode)
        if cache_key in self._cache:
            self._cache.move_to_end(cache_key)
            return self._cache[cache_key]
        rows = self.episode_range(episode)
        start = float(self.episodes[episode][f"videos/{key}/from_timestamp"])
        times = start + self.numbers["timestamp"][rows.start:rows.stop].astype(np.float64)
        path = self.video_path(key, episode)
        if not os.path.isfile(path):
            raise fmt.DatasetError(f"{path} is missing (episode {episode} of camera {key}): "
                                   f"{fmt.FIX_COPY_AGAIN}")
        frames = decode_frames(path, times)
        self._cache[cache_key] = frames
        while len(self._cache) > self.cache_episodes:
            self._cache.popitem(last=False)
        return frames

    def frame(self, index: int) -> Dict[str, object]:
        """Frame ``index``: its numbers, its camera images (uint8 ``[H, W, 3]``) and its task."""
        episode = int(self.numbers["episode_index"][index])
        offset = index - self.episode_range(episode).start
        out: Dict[str, object] = {k: v[index] for k, v in self.numbers.items()}
        for key in self.video_keys:
            out[key] = self.episode_frames(key, episode)[offset]
        out["task"] = self.tasks[int(self.numbers["task_index"][index])]
        return out

    # ---- statistics ----------------------------------------------------------------------------
    @property
    def stats(self) -> Dict[str, Dict[str, np.ndarray]]:
        """``meta/stats.json`` when the dataset has it, else computed from the frames (images from
        decoded episodes: a pass over the videos)."""
        if self._stats is None:
            path = os.path.join(self.root, fmt.STATS_PATH)
            self._stats = from_json(fmt.read_json(self.root, fmt.STATS_PATH)) if os.path.isfile(path) \
                else self._compute_stats()
        return self._stats

    def _compute_stats(self) -> Dict[str, Dict[str, np.ndarray]]:
        out = {k: feature_stats(v, is_image=False) for k, v in self.numbers.items()}
        for key in self.video_keys:
            out[key] = merge_stats([feature_stats(self.episode_frames(key, e), is_image=True)
                                    for e in range(self.num_episodes)])
        return out


def _column(table, key: str, feature: dict) -> np.ndarray:
    """A column as numpy: ``[N]`` for LeRobot's own features (index, time, ...), ``[N, *shape]``
    for the others, whether stored as lists or (shape ``[1]``, as LeRobot writes it) as values."""
    import pyarrow as pa

    column = table.column(key).combine_chunks()
    shape = [int(s) for s in feature["shape"]]
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) \
            or pa.types.is_large_list(column.type):
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(column), *shape).astype(feature["dtype"], copy=False)
    values = column.to_numpy(zero_copy_only=False)
    if key not in fmt.DEFAULT_FEATURES:
        values = values.reshape(len(column), *shape)
    return values.astype(feature["dtype"], copy=False)
