"""A family's hooks (config/family_hooks.py): read from its config class with the table's default
where it says nothing; each family's own values are of the kind the command that reads it needs."""

import os

import pytest
from conftest import REPO_ROOT

from embodied_async.config.family_hooks import ENV_HOOKS, MODEL_HOOKS, hook
from embodied_async.config.schema import EnvConfig, ModelConfig
from embodied_async.registry import families


def test_the_base_classes_hold_no_hook_and_a_family_without_one_gets_the_default():
    assert not any(hasattr(EnvConfig, name) for name in ENV_HOOKS)
    assert not any(hasattr(ModelConfig, name) for name in MODEL_HOOKS)
    synthetic = families("env")["synthetic_image"]
    assert hook(synthetic, "scripted_expert") is None and hook(synthetic, "control_keys") == ()
    with pytest.raises(KeyError):
        hook(synthetic, "scripted_exprt")


def test_every_familys_hooks_are_what_their_commands_read():
    recipes = {name[:-5] for name in os.listdir(os.path.join(REPO_ROOT, "configs")) if name.endswith(".yaml")}
    for cls in families("env").values():
        expert = hook(cls, "scripted_expert")
        assert expert is None or (isinstance(expert, str) and ":" in expert), cls
        assert all(hasattr(cls, "__dataclass_fields__") and key in cls.__dataclass_fields__
                   for key in hook(cls, "control_keys")), cls
    for cls in families("model").values():
        for name in ("default_recipe", "cpu_recipe"):
            assert hook(cls, name) is None or hook(cls, name) in recipes, (cls, name)
        assert hook(cls, "recognizes") is None or callable(hook(cls, "recognizes")), cls
        exporter = hook(cls, "exporter")
        assert exporter is None or (isinstance(exporter, str) and ":" in exporter), cls
    assert hook(families("env")["maniskill"], "scripted_expert") == "envs.maniskill.scripted:build_expert"
