"""Register the typed schema with Hydra, so every recipe composes on top of it.

Recipes list ``train_schema`` first in their defaults: Hydra then knows every key (an override
like ``runner.resume_dir=...`` works without ``+``) and rejects unknown ones before anything starts.
"""

from hydra.core.config_store import ConfigStore

from embodied_async.config.schema import TrainConfig

SCHEMA_NAME = "train_schema"


def register_schema() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)
