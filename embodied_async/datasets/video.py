"""Camera streams as mp4 files (PyAV): one file holds many episodes of one camera, one after the
other in time, as LeRobot's format v3.0 stores them.

Encoding follows LeRobot's defaults (AV1 by SVT-AV1, yuv420p, a key frame every 2 frames so any
frame decodes after at most one other); H.264 is the alternative for players without AV1.
Decoding picks, for each wanted time, the decoded frame whose presentation time is nearest, and
refuses a file whose frames are further than ``TIME_TOLERANCE_S`` from the times asked for.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np

from embodied_async.datasets.lerobot_format import FIX_COPY_AGAIN, DatasetError

# codec name in info.json -> the encoder PyAV uses, and its options
ENCODERS: Dict[str, tuple] = {
    "av1": ("libsvtav1", {"g": "2", "crf": "30"}),
    "h264": ("libx264", {"g": "2", "crf": "23"}),
}
TIME_TOLERANCE_S = 1e-4  # LeRobot's tolerance between a frame's timestamp and the one asked for


class VideoError(DatasetError):
    """A video file that cannot be written or read as expected (the message names the file). A
    ``DatasetError``: a file damaged inside is found at its first decode, in a trainer, and must
    end the run as the start-up checks do, one line naming the file."""


def _quiet_encoders() -> None:
    # SVT-AV1 prints a banner of ~20 lines per file on stderr unless told otherwise
    os.environ.setdefault("SVT_LOG", "1")


class VideoFileWriter:
    """Frames appended to one mp4 file, one call per episode; frame ``i`` of the file is shown at
    ``i / fps`` seconds. ``close`` flushes the encoder and finishes the file."""

    def __init__(self, path: str, fps: int, codec: str, height: int, width: int):
        import av

        if codec not in ENCODERS:
            raise VideoError(f"video codec {codec!r} is not supported; use one of {sorted(ENCODERS)}")
        if codec == "h264" and (height % 2 or width % 2):
            raise VideoError(f"H.264 in yuv420p needs even sides; this camera is {height}x{width}: use av1")
        _quiet_encoders()
        encoder, options = ENCODERS[codec]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path, self.height, self.width = path, height, width
        self.frames_written = 0
        self._container = av.open(path, "w")
        self._stream = self._container.add_stream(encoder, rate=int(fps), options=dict(options))
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"

    def add(self, frames: np.ndarray) -> None:
        """Append ``frames`` uint8 ``[T, H, W, 3]``."""
        import av

        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise VideoError(f"{self.path}: frames must be uint8 [T, {self.height}, {self.width}, 3], got "
                             f"{frames.dtype} {list(frames.shape)}")
        for frame in frames:
            # converted here with one thread, as decode_frames does, so the encoder keeps no scaler
            picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            picture = picture.reformat(format="yuv420p", threads=1)
            picture.pts = self.frames_written
            self.frames_written += 1
            for packet in self._stream.encode(picture):
                self._container.mux(packet)

    def close(self) -> None:
        if self._container is None:
            return
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._container = None


def decode_frames(path: str, timestamps: np.ndarray, tolerance_s: float = TIME_TOLERANCE_S) -> np.ndarray:
    """The frames of ``path`` shown at ``timestamps`` (seconds, ascending), uint8 ``[N, H, W, 3]``.

    Seeks to the key frame before the first time and decodes forward to the last one, so reading
    one episode of a file costs that episode (plus at most a group of pictures), not the file."""
    import av

    timestamps = np.asarray(timestamps, dtype=np.float64)
    if timestamps.size == 0:
        raise VideoError(f"{path}: no timestamps asked for")
    first, last = float(timestamps.min()), float(timestamps.max())
    times, pictures = [], []
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            container.seek(max(0, int(first / stream.time_base)), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                t = float(frame.pts * stream.time_base)
                if t < first - tolerance_s:
                    continue
                times.append(t)
                # one thread: PyAV keeps the scaler per thread, and one with a thread pool hangs a
                # process forked (with a preexec_fn, as Ray starts a raylet) from another thread
                # when that child frees it; frames this small gain nothing from threads
                pictures.append(frame.to_ndarray(format="rgb24", threads=1))
                if t >= last - tolerance_s:
                    break
    except (av.error.FFmpegError, IndexError, ValueError, OSError) as err:  # damaged, truncated, no video stream
        raise VideoError(f"cannot decode {path}: {type(err).__name__}: {error_detail(err)}: the file is damaged; "
                         f"{FIX_COPY_AGAIN}") from None
    return _nearest(path, np.asarray(times), pictures, timestamps, tolerance_s)


def error_detail(err: Exception) -> str:
    """What went wrong, in one short line: FFmpeg's reason without the file name (the message
    names the file once), else the first line of the error."""
    reason = getattr(err, "strerror", None)
    if reason:
        return str(reason)
    return str(err).splitlines()[0] if str(err) else "no detail"


def _nearest(path: str, times: np.ndarray, pictures: list, wanted: np.ndarray, tolerance_s: float) -> np.ndarray:
    if not pictures:
        raise VideoError(f"{path}: no frame between {wanted.min():.4f} s and {wanted.max():.4f} s (a damaged or "
                         f"truncated file, or episode timestamps that do not belong to it): {FIX_COPY_AGAIN}")
    index = np.abs(wanted[:, None] - times[None, :]).argmin(axis=1)
    gap = np.abs(times[index] - wanted)
    if float(gap.max()) > tolerance_s:
        worst = int(gap.argmax())
        raise VideoError(f"{path}: the frame nearest to {wanted[worst]:.4f} s is at {times[index[worst]]:.4f} s "
                         f"(more than {tolerance_s} s away): the file is damaged or truncated, or its frame rate "
                         f"differs from the dataset's fps: {FIX_COPY_AGAIN}")
    return np.stack([pictures[i] for i in index])


def video_feature_info(codec: str, height: int, width: int, fps: int) -> Dict[str, object]:
    """The ``info`` block of a video feature in ``meta/info.json``."""
    return {"video.height": height, "video.width": width, "video.codec": codec, "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}
