"""Synthetic image env family (``env.name: synthetic_image``): camera-shaped frames with a
scripted reward, for checking the model path's speed where no simulator or assets exist."""
