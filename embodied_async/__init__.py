"""embodied_async: asynchronous PPO for robot policies in simulation (framework layer)."""

__version__ = "0.1.0"
