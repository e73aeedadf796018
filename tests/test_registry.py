"""The family registry: lookups, conflicts and the protocol check at build time."""

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
from conftest import REPO_ROOT

from embodied_async.config import ConfigError
from embodied_async.config.schema import EnvConfig, ModelConfig
from embodied_async.registry import build_env, family_config, register_family


@dataclass
class IncompleteEnvConfig(EnvConfig):
    name: str = "incomplete_env"
    builder: ClassVar[str] = "test_registry:IncompleteEnv"


class IncompleteEnv:
    """Has no step(): the build must say so, naming the protocol."""

    def __init__(self, cfg, num_envs, seed):
        self.num_envs, self.spec = num_envs, None

    def reset(self, seed=None):
        pass

    def reset_envs(self, indices):
        pass

    def close(self):
        pass


def test_a_built_object_missing_a_protocol_method_is_named():
    register_family("env", IncompleteEnvConfig)
    assert family_config("env", "incomplete_env") is IncompleteEnvConfig
    with pytest.raises(TypeError, match=r"env.name=incomplete_env: .* lacks step of the Env protocol"):
        build_env(IncompleteEnvConfig(), num_envs=1, seed=0)


def test_a_second_family_under_a_taken_name_is_refused():
    @dataclass
    class ImpostorConfig(ModelConfig):
        name: str = "mlp"
        builder: ClassVar[str] = "somewhere:Else"

    with pytest.raises(ValueError, match=r"'mlp' is already registered by models.mlp.configuration_mlp.MLPConfig"):
        register_family("model", ImpostorConfig)
    assert family_config("model", "mlp").__module__ == "models.mlp.configuration_mlp"


def test_a_family_class_must_name_its_builder():
    @dataclass
    class NoBuilderConfig(ModelConfig):
        name: str = "no_builder"

    with pytest.raises(TypeError, match="NoBuilderConfig.builder must name the builder as 'module:callable'"):
        register_family("model", NoBuilderConfig)


def test_unknown_names_list_the_registered_families():
    with pytest.raises(ConfigError, match=r"model.name='nope' is not a registered policy family; registered: "
                                          r"cnn, .*mlp.*openvla"):
        family_config("model", "nope")


@pytest.mark.slow  # a fresh interpreter
def test_another_projects_package_of_our_top_level_name_is_named_not_loaded(tmp_path):
    """A folder named like one of this project's family packages, where Python looks first (here the
    working directory), would stand in for ours: the families it would hide are refused naming it."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    code = ("from embodied_async.config import ConfigError\n"
            "from embodied_async.registry import family_config\n"
            "family_config('env', 'maniskill')  # the other package stands beside ours untouched\n"
            "try:\n    family_config('model', 'mlp')\nexcept ConfigError as err:\n    print(err)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"the package 'models' Python finds first is {tmp_path / 'models'}, not this project's " \
           f"{os.path.join(REPO_ROOT, 'models')}" in proc.stdout
