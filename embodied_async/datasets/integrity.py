"""A dataset checked against itself before a run trains on it: its header (``meta/info.json``)
agrees with the data it describes, its numbers are finite, and every video file its episodes
point at opens and covers them.

Each refusal is a ``DatasetError`` of one line naming the file, what is wrong and the fix. The
checks are cheap: the numbers are in memory already (``DatasetReader.numbers``), and a video
check opens the container, reads its index and one packet near its end, decoding nothing (a file
damaged inside is refused at its first decode instead, ``video.decode_frames``).
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import numpy as np

from embodied_async.datasets import lerobot_format as fmt
from embodied_async.datasets.video import TIME_TOLERANCE_S, error_detail

# how many episodes a refusal lists before it only counts them: the line stays one line
NAMED_EPISODES = 5
DTYPE_KINDS = {"float32": "f", "float64": "f", "int64": "i", "int32": "i", "bool": "b"}


def _arrow_kind(arrow_type) -> str:
    import pyarrow as pa

    if pa.types.is_floating(arrow_type):
        return "f"
    if pa.types.is_integer(arrow_type):
        return "i"
    return "b" if pa.types.is_boolean(arrow_type) else str(arrow_type)


def _values_per_frame(column) -> Tuple[List[int], object]:
    """(the distinct numbers of values a frame holds, their arrow type) of one data column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_fixed_size_list(column.type):
        return [column.type.list_size], column.type.value_type
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.unique(pc.list_value_length(column)).to_pylist()
        return sorted(int(n) for n in lengths if n is not None), column.type.value_type
    return [1], column.type


def check_column(path: str, key: str, feature: dict, column) -> None:
    """A data file's column holds what the header declares: as many values a frame as the
    feature's shape, of the declared kind (a float stored where the header says int would be cut)."""
    shape = [int(s) for s in feature["shape"]]
    declared = 1 if key in fmt.DEFAULT_FEATURES else int(np.prod(shape))
    sizes, value_type = _values_per_frame(column)
    fix = f"fix features[{key!r}] in meta/info.json to match the data, or {fmt.FIX_RECOLLECT}"
    if sizes and sizes != [declared]:
        held = sizes[0] if len(sizes) == 1 else f"from {sizes[0]} to {sizes[-1]}"
        raise fmt.DatasetError(f"{path} holds {held} values a frame of {key!r}; meta/info.json says its shape is "
                               f"{shape} ({declared} values): {fix}")
    kind = DTYPE_KINDS.get(feature["dtype"])
    if kind is not None and _arrow_kind(value_type) != kind:
        raise fmt.DatasetError(f"{path} holds {value_type} values of {key!r}; meta/info.json says its dtype is "
                               f"{feature['dtype']}: {fix}")


def check_totals(reader) -> None:
    """The header's counts are those of meta/episodes and of the data files."""
    info_path = os.path.join(reader.root, fmt.INFO_PATH)
    frames, episodes = len(reader.numbers["index"]), len(reader.episodes)
    listed_frames = sum(int(row["length"]) for row in reader.episodes)
    held = f"meta/episodes lists {episodes} episodes of {listed_frames} frames, the data files hold {frames} frames"
    if listed_frames != frames:
        raise fmt.DatasetError(f"{reader.root}: {held}: a data file or a meta/episodes file is missing or from "
                               f"another dataset: {fmt.FIX_RECOLLECT}")
    for name, counted in (("total_episodes", episodes), ("total_frames", frames)):
        said = reader.info.get(name)
        if said is not None and int(said) != counted:
            raise fmt.DatasetError(f"{info_path} says {name} {said}; {held}: fix {name} in meta/info.json to "
                                   f"{counted} if the episodes are complete, else {fmt.FIX_RECOLLECT}")


def check_finite(reader, keys) -> None:
    """No NaN or infinity in the float features ``keys`` the run reads (states, actions): one
    would reach the loss, or become an action token, without a word. A column the run does not
    read is no reason to refuse the dataset."""
    for key in keys:
        values = reader.numbers.get(key)
        if values is None or reader.features[key]["dtype"] not in ("float32", "float64"):
            continue
        bad_frames = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
        if bad_frames.size:
            _refuse_non_finite(reader, key, bad_frames)


def _refuse_non_finite(reader, key: str, bad_frames: np.ndarray) -> None:
    first = int(bad_frames[0])
    episode, frame = int(reader.numbers["episode_index"][first]), int(reader.numbers["frame_index"][first])
    value = reader.numbers[key][first].reshape(-1)
    shown = "nan" if np.isnan(value).any() else "inf"
    episodes = sorted({int(e) for e in reader.numbers["episode_index"][bad_frames]})
    named = f"{episodes[:NAMED_EPISODES]}" + (f" and {len(episodes) - NAMED_EPISODES} more" if len(episodes) >
                                               NAMED_EPISODES else "")
    row = reader.episodes[episode]
    path = os.path.join(reader.root, fmt.DATA_PATH.format(chunk_index=int(row["data/chunk_index"]),
                                                         file_index=int(row["data/file_index"])))
    count = f"{bad_frames.size} frame" + ("s" if bad_frames.size > 1 else "")
    raise fmt.DatasetError(f"{path}: {key!r} is {shown} in episode {episode}, frame {frame} ({count} with "
                           f"non-finite {key!r} in all, in episodes {named}): a policy cannot learn from it; "
                           f"{fmt.FIX_RECOLLECT}, or write the dataset again without those episodes")


def check_video_files(reader) -> None:
    """Every video file an episode points at exists, opens as a video of the camera's size, and
    lasts (and holds a frame) until the last episode in it ends."""
    for key in reader.video_keys:
        for path, episodes in _episodes_by_video_file(reader, key).items():
            _check_video_file(reader, key, path, episodes)


def _episodes_by_video_file(reader, key: str) -> Dict[str, List[int]]:
    files: Dict[str, List[int]] = {}
    for episode in range(reader.num_episodes):
        files.setdefault(reader.video_path(key, episode), []).append(episode)
    return files


def _episode_end(reader, key: str, episode: int) -> Tuple[float, float]:
    """(the time the episode's last frame is shown at, the time it ends) in its video file."""
    row, rows = reader.episodes[episode], reader.episode_range(episode)
    last = float(row[f"videos/{key}/from_timestamp"]) + float(reader.numbers["timestamp"][rows.stop - 1])
    return last, float(row.get(f"videos/{key}/to_timestamp") or last + 1.0 / reader.fps)


def _check_video_file(reader, key: str, path: str, episodes: List[int]) -> None:
    import av

    shown = f"{episodes[:NAMED_EPISODES]}" + (" ..." if len(episodes) > NAMED_EPISODES else "")
    where = f"camera {key!r}, episodes {shown}"
    if not os.path.isfile(path):
        raise fmt.DatasetError(f"{path} is missing ({where}): {fmt.FIX_COPY_AGAIN}")
    latest = max(episodes, key=lambda e: _episode_end(reader, key, e)[1])
    last_frame, end = _episode_end(reader, key, latest)
    try:
        with av.open(path) as container:
            if not container.streams.video:
                raise fmt.DatasetError(f"{path} holds no video stream ({where}): {fmt.FIX_COPY_AGAIN}")
            stream = container.streams.video[0]
            _check_frame_size(reader, key, path, stream)
            _check_duration(reader, path, stream, container, latest, end, where)
            if not _has_packet_at(container, stream, last_frame):
                raise fmt.DatasetError(f"{path} is truncated: it has no frame at {last_frame:.3f} s, the last of "
                                       f"episode {latest} ({where}): {fmt.FIX_COPY_AGAIN}")
    except fmt.DatasetError:
        raise
    except (av.error.FFmpegError, IndexError, ValueError, OSError) as err:  # garbage, cut short, unreadable
        raise fmt.DatasetError(f"{path} cannot be read as a video ({type(err).__name__}: {error_detail(err)}; "
                               f"{where}): the file is damaged or truncated; {fmt.FIX_COPY_AGAIN}") from None


def _check_frame_size(reader, key: str, path: str, stream) -> None:
    height, width = (int(s) for s in reader.features[key]["shape"][:2])
    got = (int(stream.codec_context.height), int(stream.codec_context.width))
    if got != (height, width):
        raise fmt.DatasetError(f"{path} is {got[0]}x{got[1]} (height x width); meta/info.json says camera {key!r} "
                               f"is {height}x{width}: fix features[{key!r}].shape in meta/info.json to match the "
                               f"videos, or {fmt.FIX_RECOLLECT}")


def _check_duration(reader, path: str, stream, container, episode: int, end: float, where: str) -> None:
    if stream.duration is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        duration = container.duration / 1e6  # in FFmpeg's AV_TIME_BASE, microseconds
    else:
        return  # a container that does not say: the packet near the end is the check
    # half a frame: the duration's own rounding, never a missing frame
    if duration < end - 0.5 / reader.fps:
        raise fmt.DatasetError(f"{path} lasts {duration:.3f} s but episode {episode} ends at {end:.3f} s in it "
                               f"(meta/episodes; {where}): the file is truncated, or meta/episodes belongs to "
                               f"another copy of the videos; {fmt.FIX_COPY_AGAIN}")


def _has_packet_at(container, stream, time_s: float) -> bool:
    """Whether the file holds a packet shown at ``time_s``: seek to the key frame before it (the
    index, no decoding) and read on; a file cut short ends before (its index may still list it)."""
    container.seek(max(0, int(time_s / stream.time_base)), stream=stream, backward=True, any_frame=False)
    for packet in container.demux(stream):
        if packet.pts is not None and float(packet.pts * stream.time_base) >= time_s - TIME_TOLERANCE_S:
            return True
    return False
