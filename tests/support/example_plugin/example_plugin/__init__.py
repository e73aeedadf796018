"""An example plugin package: one policy family and one env family for embodied_async."""
