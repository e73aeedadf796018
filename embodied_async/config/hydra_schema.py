"""Register the typed schema with Hydra, so every recipe composes on top of it.

Recipes list ``train_schema`` first in their defaults: Hydra then knows every key (an override
like ``runner.resume_dir=...`` works without ``+``) and rejects unknown ones before anything starts.
``train_schema`` also holds what every recipe tells Hydra itself, once: the run's folder is the log
folder (``hydra.run.dir``, where Hydra writes ``.hydra/``), and the working directory stays put.
Each registered family's config class is stored in its group as ``<family>_schema``
(``model/mlp_schema``, ``env/maniskill_schema``, ...): a YAML file of the group lists it first in
its defaults, so its keys are type-checked by the family's own dataclass.
"""

from hydra.core.config_store import ConfigStore

from embodied_async.config.schema import TrainConfig
from embodied_async.registry import ENTRY_POINT_GROUPS, families

SCHEMA_NAME = "train_schema"
HYDRA_SETTINGS = {"run": {"dir": "${runner.logger.log_path}"}, "job": {"chdir": False}}


def register_schema() -> None:
    store = ConfigStore.instance()
    store.store(name=f"{SCHEMA_NAME}_fields", node=TrainConfig)
    store.store(name=SCHEMA_NAME, node={"defaults": [f"{SCHEMA_NAME}_fields", "_self_"], "hydra": HYDRA_SETTINGS})
    for section in ENTRY_POINT_GROUPS:
        for name, config_cls in families(section, refresh=True).items():  # packages installed since
            store.store(group=section, name=f"{name}_schema", node=config_cls)
