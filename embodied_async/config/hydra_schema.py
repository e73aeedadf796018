"""Register the typed schema with Hydra, so every recipe composes on top of it.

Recipes list ``train_schema`` first in their defaults: Hydra then knows every key (an override
like ``runner.resume_dir=...`` works without ``+``) and rejects unknown ones before anything starts.
Each registered family's config class is stored in its group as ``<family>_schema``
(``model/mlp_schema``, ``env/maniskill_schema``, ...): a YAML file of the group lists it first in
its defaults, so its keys are type-checked by the family's own dataclass.
"""

from hydra.core.config_store import ConfigStore

from embodied_async.config.schema import TrainConfig
from embodied_async.registry import ENTRY_POINT_GROUPS, families

SCHEMA_NAME = "train_schema"


def register_schema() -> None:
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=TrainConfig)
    for section in ENTRY_POINT_GROUPS:
        for name, config_cls in families(section, refresh=True).items():  # packages installed since
            store.store(group=section, name=f"{name}_schema", node=config_cls)
