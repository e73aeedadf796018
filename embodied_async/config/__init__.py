"""Typed configuration: the schema (every default, once) and start-up validation."""

from embodied_async.config.schema import TrainConfig
from embodied_async.config.validate import ConfigError, check, resolve_placement, to_train_config

__all__ = ["TrainConfig", "ConfigError", "check", "resolve_placement", "to_train_config"]
