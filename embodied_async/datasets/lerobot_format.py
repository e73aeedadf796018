"""LeRobot's dataset format v3.0 on disk, as LeRobot 0.4 writes it: the paths, ``meta/info.json``,
``meta/tasks.parquet``, ``meta/episodes/...parquet`` and the per-frame data parquet files.

```
meta/info.json                         features, fps, path templates, counts
meta/stats.json                        per-feature statistics (stats.py)
meta/tasks.parquet                     the task strings (pandas index) and their task_index
meta/episodes/chunk-CCC/file-FFF.parquet   one row per episode: length, tasks, where its rows and
                                           video frames are, its own statistics
data/chunk-CCC/file-FFF.parquet        one row per frame: numbers, timestamp, indices
videos/<key>/chunk-CCC/file-FFF.mp4    one camera, many episodes in a row
```

Files of a dataset are numbered by one counter ``n`` (chunk ``n // chunks_size``, file
``n % chunks_size``); nothing here is ever unpickled or executed, only parsed.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, List

import numpy as np

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
# what this project adds beside LeRobot's files (LeRobot ignores it): the env config the episodes
# were collected in and, per episode, its seed and source
COLLECTION_PATH = "meta/collection.json"
# the features every frame has besides the dataset's own, in LeRobot's order and types
DEFAULT_FEATURES: Dict[str, Dict[str, object]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
NUMBER_DTYPES = ("float32", "float64", "int64", "int32", "bool")
# the fixes a refusal of damaged data names: our datasets come from the collector, others from a
# copy or a download that can be made again
FIX_RECOLLECT = "re-collect the dataset with python -m embodied_async collect"
FIX_COPY_AGAIN = f"copy the file again from where the dataset came from, or {FIX_RECOLLECT}"


class DatasetError(ValueError):
    """A folder that is not a usable LeRobot dataset, or data that does not fit it (the message
    names the file or key, and what would fix it)."""


def file_location(counter: int) -> Dict[str, int]:
    return {"chunk_index": counter // CHUNKS_SIZE, "file_index": counter % CHUNKS_SIZE}


def file_counter(chunk_index: int, file_index: int) -> int:
    return int(chunk_index) * CHUNKS_SIZE + int(file_index)


def video_keys(features: Dict[str, dict]) -> List[str]:
    return [k for k, f in features.items() if f["dtype"] == "video"]


def number_keys(features: Dict[str, dict]) -> List[str]:
    """The dataset's own numeric features (state, action, ...), not the default ones."""
    return [k for k, f in features.items() if f["dtype"] != "video" and k not in DEFAULT_FEATURES]


def make_info(fps: int, features: Dict[str, dict], robot_type=None) -> Dict[str, object]:
    return {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": 0, "total_frames": 0,
            "total_tasks": 0, "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200, "fps": int(fps), "splits": {}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH, "features": {**features, **DEFAULT_FEATURES}}


def check_features(features: Dict[str, dict]) -> None:
    """A writer's features: video ``[H, W, 3]`` or numbers of a known dtype, names of the default
    features not reused."""
    for key, feature in features.items():
        if key in DEFAULT_FEATURES:
            raise DatasetError(f"feature {key!r} is one every frame has already; name yours differently")
        dtype, shape = feature.get("dtype"), list(feature.get("shape", []))
        if dtype == "video":
            if len(shape) != 3 or shape[2] != 3:
                raise DatasetError(f"feature {key!r}: a video's shape is [height, width, 3], got {shape}")
        elif dtype not in NUMBER_DTYPES:
            raise DatasetError(f"feature {key!r}: dtype {dtype!r}; use 'video' or one of {NUMBER_DTYPES}")


def read_json(root: str, rel: str):
    path = os.path.join(root, rel)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{root} is not a LeRobot dataset: {rel} is missing (a dataset holds meta/info.json, "
                           "meta/tasks.parquet, meta/episodes/ and data/): give the dataset's own folder, or copy "
                           "the whole dataset folder again") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path} is damaged ({err}): fix it, or {FIX_COPY_AGAIN}") from None


def replace_file(root: str, rel: str, write: Callable[[str], None]) -> None:
    """``write(path)`` to a temporary name, then renamed: a crash leaves the old file or the new one."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def write_json(root: str, rel: str, obj) -> None:
    def write(path: str) -> None:
        with open(path, "w") as f:
            json.dump(obj, f, indent=4)

    replace_file(root, rel, write)


def read_info(root: str) -> Dict[str, object]:
    info = read_json(root, INFO_PATH)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version != CODEBASE_VERSION:
        raise DatasetError(f"{os.path.join(root, INFO_PATH)}: codebase_version {version!r}; this reader reads "
                           f"LeRobot's format {CODEBASE_VERSION} (convert an older dataset with LeRobot's "
                           "convert_dataset_v21_to_v30 script)")
    missing = [k for k in ("fps", "features", "data_path", "total_episodes") if k not in info]
    if missing:
        raise DatasetError(f"{os.path.join(root, INFO_PATH)} lacks {missing}: fix meta/info.json, or {FIX_COPY_AGAIN}")
    features = info["features"] if isinstance(info["features"], dict) else {}
    stills = [k for k, f in features.items() if isinstance(f, dict) and f.get("dtype") == "image"]
    if stills:
        raise DatasetError(f"{os.path.join(root, INFO_PATH)}: the cameras {stills} are images kept inside the parquet "
                           "files (dtype image); this reader takes cameras stored as videos (dtype video), LeRobot's "
                           "default: use the dataset's video version (LeRobot's own copies on the hub keep their "
                           "cameras as videos) or re-encode its cameras as videos")
    return info


def read_table(root: str, rel: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        raise DatasetError(f"{path} is missing (named by the dataset's metadata): {FIX_COPY_AGAIN}")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        detail = str(err).splitlines()[0] if str(err) else "no detail"
        raise DatasetError(f"cannot read {path} (damaged parquet?): {detail}: {FIX_COPY_AGAIN}") from None


def write_table(root: str, rel: str, table) -> None:
    import pyarrow.parquet as pq

    replace_file(root, rel, lambda path: pq.write_table(table, path))


def read_tasks(root: str) -> List[str]:
    """Task strings by task_index (the parquet's pandas index holds the string)."""
    table = read_table(root, TASKS_PATH)
    names = [n for n in table.column_names if n != "task_index"]
    if "task_index" not in table.column_names or not names:
        raise DatasetError(f"{os.path.join(root, TASKS_PATH)}: expected columns task_index and the task strings, "
                           f"got {table.column_names}")
    column = "task" if "task" in names else names[0]
    indices, texts = table.column("task_index").to_pylist(), table.column(column).to_pylist()
    tasks = [""] * len(indices)
    for index, text in zip(indices, texts):
        if not 0 <= index < len(tasks):
            raise DatasetError(f"{os.path.join(root, TASKS_PATH)}: task_index {index} out of range")
        tasks[index] = text
    return tasks


def tasks_table(tasks: List[str]):
    """``meta/tasks.parquet`` as pandas writes a frame indexed by the task string."""
    import pyarrow as pa

    pandas_meta = {"index_columns": ["__index_level_0__"],
                   "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                       "numpy_type": "str", "metadata": {"encoding": "UTF-8"}}],
                   "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                                "numpy_type": "int64", "metadata": None},
                               {"name": None, "field_name": "__index_level_0__", "pandas_type": "object",
                                "numpy_type": "str", "metadata": None}],
                   "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__}}
    schema = pa.schema([("task_index", pa.int64()), ("__index_level_0__", pa.large_string())],
                       metadata={b"pandas": json.dumps(pandas_meta).encode()})
    return pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": list(tasks)}, schema=schema)


def read_episodes(root: str) -> List[Dict[str, object]]:
    """Every episode's row from ``meta/episodes``, ordered by episode_index (checked contiguous)."""
    folder = os.path.join(root, "meta", "episodes")
    if not os.path.isdir(folder):
        raise DatasetError(f"{root} is not a LeRobot dataset: meta/episodes/ is missing (it says where each episode "
                           f"is): copy the whole dataset folder again, or {FIX_RECOLLECT}")
    rows: List[Dict[str, object]] = []
    for chunk in sorted(os.listdir(folder)):
        for name in sorted(os.listdir(os.path.join(folder, chunk))):
            if name.endswith(".parquet"):
                rows += read_table(root, os.path.join("meta", "episodes", chunk, name)).to_pylist()
    rows.sort(key=lambda r: r["episode_index"])
    if [r["episode_index"] for r in rows] != list(range(len(rows))):
        raise DatasetError(f"{folder}: episode indices are not 0..{len(rows) - 1} (a file is missing or doubled): "
                           f"copy the whole dataset folder again, or {FIX_RECOLLECT}")
    return rows


def is_scalar(key: str, feature: dict) -> bool:
    """Whether a number feature is stored one value per frame, not as a list: LeRobot's own
    features (the frame's index, time, ...) and, as LeRobot types features, any of shape ``[1]``
    (its datasets fail to load a list of one where the header says shape ``[1]``)."""
    return key in DEFAULT_FEATURES or [int(s) for s in feature["shape"]] == [1]


def data_columns(features: Dict[str, dict]):
    """(arrow schema, HF datasets' feature description) of the per-frame data files."""
    import pyarrow as pa

    arrow = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
             "bool": pa.bool_()}
    fields, described = [], {}
    for key, feature in features.items():
        if feature["dtype"] == "video":
            continue
        dtype, size = feature["dtype"], int(np.prod(feature["shape"]))
        value = {"dtype": dtype, "_type": "Value"}
        if is_scalar(key, feature):
            fields.append((key, arrow[dtype]))
            described[key] = value
        else:
            fields.append((key, pa.list_(arrow[dtype], size)))
            described[key] = {"feature": value, "length": size, "_type": "List"}
    hf = json.dumps({"info": {"features": described}})
    return pa.schema(fields, metadata={b"huggingface": hf.encode()}), described
