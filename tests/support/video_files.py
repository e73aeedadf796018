"""Reading back the videos an evaluation wrote."""

import numpy as np


def decode_mp4(path):
    """Every frame of an mp4, decoded by ffmpeg -> uint8 [T, H, W, 3]."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(path)
    meta = next(reader)
    width, height = meta["size"]
    return np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])
