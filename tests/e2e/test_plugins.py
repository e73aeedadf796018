"""A policy family and an env family from a package outside this repository (tests/support/
example_plugin), installed with pip and found through its entry points, as a user's would be."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from omegaconf import OmegaConf

from embodied_async.config import ConfigError, to_train_config

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

PLUGIN_SOURCE = os.path.join(REPO_ROOT, "tests", "support", "example_plugin")
PLUGIN_CONFIGS = os.path.join(PLUGIN_SOURCE, "configs")  # the plugin's recipe and its group files
ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
PLUGIN_NAMES = ("linear_gaussian", "drift_point", "example_plugin", "LinearPolicyConfig", "DriftPointConfig")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip-installs the plugin (offline, no dependencies) into a folder put on the import path here
    and, through PYTHONPATH, in the processes this module starts. Yields that folder."""
    root = tmp_path_factory.mktemp("plugin")
    source, site = root / "source", root / "site"
    shutil.copytree(PLUGIN_SOURCE, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "configs"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(source)], check=True, timeout=300)
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))


def plugin_env(site) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


def test_the_framework_names_none_of_them():
    for folder, _, files in os.walk(os.path.join(REPO_ROOT, "embodied_async")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                assert not [n for n in PLUGIN_NAMES if n in text], os.path.join(folder, name)


def test_discovered_through_entry_points(installed):
    from embodied_async.registry import families

    policies, envs = families("model", refresh=True), families("env")
    assert policies["linear_gaussian"].__module__ == "example_plugin.configuration"
    assert envs["drift_point"].__module__ == "example_plugin.configuration"
    assert {"mlp", "maniskill"} <= set(policies) | set(envs)  # this repository's own, found the same way


def compose(overrides=(), config_dir=None):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from embodied_async.config.hydra_schema import register_schema

    register_schema()
    config_dir = config_dir or PLUGIN_CONFIGS
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="drift_linear_ppo", overrides=list(overrides))


def test_hydra_composes_the_recipe_with_their_typed_configs(installed):
    cfg = to_train_config(compose())
    assert type(cfg.model).__name__ == "LinearPolicyConfig" and cfg.model.init_log_std == -0.7
    assert type(cfg.env).__name__ == "DriftPointConfig" and (cfg.env.horizon, cfg.env.dims) == (6, 3)


@pytest.mark.parametrize("section, file", [("model", "linear.yaml"), ("env", "drift.yaml")])
def test_an_unknown_key_in_their_yaml_is_named(installed, tmp_path, section, file):
    configs = tmp_path / "configs"
    shutil.copytree(PLUGIN_CONFIGS, configs)
    with open(configs / section / file, "a") as f:
        f.write("horizn: 3\n")
    with pytest.raises(Exception, match=rf"Key 'horizn' not in '\w+Config'[\s\S]*full_key: {section}.horizn"):
        compose(config_dir=configs)
    # the same mistake in a config built in code, e.g. a test's dict
    raw = OmegaConf.to_container(compose(), resolve=False)
    raw[section]["horizn"] = 3
    with pytest.raises(ConfigError, match=rf"unknown config key '{section}.horizn'. Valid keys under '{section}'"):
        to_train_config(raw)
    raw[section].pop("horizn")
    raw[section]["dims" if section == "env" else "init_log_std"] = -9
    with pytest.raises(ConfigError, match=rf"{section}\.(dims|init_log_std)=-9"):  # the family's own check
        to_train_config(raw)


@pytest.mark.slow
def test_their_recipe_trains_two_updates_through_the_entry_point(installed, tmp_path):
    log_path = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, ENTRY, "--config-dir", PLUGIN_CONFIGS,
         "--config-name", "drift_linear_ppo", f"runner.logger.log_path={log_path}"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=plugin_env(installed))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(log_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if "train/actor/current_version" in r]
    assert [r["train/actor/current_version"] for r in train] == [0.0, 1.0]
    assert all(r["train/actor/policy_loss"] is not None for r in train)
    # an update's interval may see no env step on a loaded machine (the env waits on the rollout,
    # which waits on the version gate): the run as a whole stepped
    assert sum(r["env/env_steps"] for r in train) > 0
    assert train[-1]["eval/success_rate"] is not None
    assert os.path.isfile(log_path / "checkpoints" / "global_step_2" / "model.safetensors")
    assert re.search(r"final eval at step 2", proc.stdout)
