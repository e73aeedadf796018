"""Typed configuration: the schema (every default, once), start-up validation, the topology."""

from embodied_async.config.checks import ConfigError
from embodied_async.config.schema import EnvConfig, ModelConfig, TrainConfig
from embodied_async.config.topology import Topology, resolve_topology
from embodied_async.config.validate import check, resolve, to_train_config

__all__ = ["ConfigError", "EnvConfig", "ModelConfig", "Topology", "TrainConfig", "check", "resolve",
           "resolve_topology", "to_train_config"]
