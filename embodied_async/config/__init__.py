"""Typed configuration: the schema (every default, once), start-up validation, the topology.

Validation (and with it omegaconf) is imported on first use, so the schema and the checks can be
read on a machine without omegaconf (``scripts/gpu_check.py`` on a bare GPU machine).
"""

from embodied_async.config.checks import ConfigError
from embodied_async.config.schema import EnvConfig, ModelConfig, TrainConfig
from embodied_async.config.topology import Topology, resolve_topology

__all__ = ["ConfigError", "EnvConfig", "ModelConfig", "Topology", "TrainConfig", "check", "resolve",
           "resolve_topology", "to_train_config"]
_VALIDATION = ("check", "resolve", "to_train_config")


def __getattr__(name):
    if name in _VALIDATION:
        from embodied_async.config import validate

        return getattr(validate, name)
    raise AttributeError(f"module 'embodied_async.config' has no attribute {name!r}")
