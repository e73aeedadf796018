"""Invalid configuration fails at start-up, naming the key path and the fix."""

import os
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT, build_config
from embodied_async.config import ConfigError, check
from embodied_async.config.validate import to_train_config

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")


def test_small_config_is_valid(tmp_path):
    cfg = build_config(tmp_path)
    assert cfg.env.num_envs == 4 and cfg.cluster.component_placement["actor"] == "3"


@pytest.mark.parametrize("override, fragment", [
    ("nonsense.key=1", "unknown config key 'nonsense.key'"),
    ("env.nmu_envs=3", "unknown config key 'env.nmu_envs'"),
    ("env.name=doesnotexist", "env.name='doesnotexist' is not allowed; use one of: "),
    ("model.name=transformer9000", "model.name='transformer9000' is not allowed; use one of: cnn, mlp"),
    ("env.obs_mode=depth", "env.obs_mode='depth'"),
    ("env.num_envs=5", "env.num_envs=5 must divide evenly over 2 env processes"),
    ("actor.global_batch_size=10", "must be a multiple of actor.global_batch_size=10"),
    ("actor.micro_batch_size=5", "share of actor.global_batch_size (16) must be a multiple of actor.micro_batch_size=5"),
    ("cluster.device_type=gpu", "asks for GPUs, but this machine has none"),
    ("cluster.component_placement.env=3-1", "cluster.component_placement"),
    ("algorithm.clip_ratio_c=0.5", "algorithm.clip_ratio_c"),
    ("runner.resume_dir=/no/such/folder", "runner.resume_dir='/no/such/folder' is not a folder"),
])
def test_bad_values_name_the_key(tmp_path, override, fragment):
    with pytest.raises(ConfigError) as err:
        build_config(tmp_path, override)
    assert fragment in str(err.value)


def test_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="env.num_envs"):
        to_train_config({"env": {"num_envs": "many"}})


def test_placement_beyond_the_gpus_present(tmp_path):
    cfg = build_config(tmp_path)
    cfg.cluster.device_type = "gpu"
    cfg.cluster.component_placement = {"env,rollout": "0-1", "actor": "0-3"}
    with pytest.raises(ConfigError, match="GPU 2, but this machine has 2 GPUs"):
        check(cfg, num_gpus=2)
    cfg.cluster.component_placement = {"env,rollout,actor": "0-1"}
    check(cfg, num_gpus=2)  # fits


def _run_entry(*overrides):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, ENTRY, *overrides], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("override", ["nonsense.key=1", "+nonsense.key=1"])
def test_cli_rejects_unknown_key_before_starting(override, tmp_path):
    proc, seconds = _run_entry(override, f"runner.logger.log_path={tmp_path}/logs")
    assert proc.returncode != 0
    assert "nonsense.key" in proc.stderr + proc.stdout
    assert "building workers" not in proc.stdout
    assert seconds < 30


def test_cli_rejects_gpu_placement_without_gpus(tmp_path):
    proc, _ = _run_entry("cluster.device_type=gpu", f"runner.logger.log_path={tmp_path}/logs")
    assert proc.returncode == 2
    assert "asks for GPUs, but this machine has none" in proc.stderr


def _compose(recipe, *overrides):
    from hydra import compose, initialize_config_dir

    from embodied_async.config.hydra_schema import register_schema

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        return compose(config_name=recipe, overrides=list(overrides))


@pytest.mark.parametrize("recipe", ["maniskill_async_ppo_mlp", "maniskill_ppo_mlp", "maniskill_async_ppo_cnn",
                                    "maniskill_async_ppo_openvla_tiny"])
def test_cpu_recipes_are_valid_here(recipe, tmp_path):
    cfg = to_train_config(_compose(recipe, f"runner.logger.log_path={tmp_path}"))
    assert cfg.runner.max_steps > 0


def test_openvla_recipe_needs_its_gpus_and_points_to_the_tiny_one(tmp_path):
    raw = _compose("maniskill_async_ppo_openvla", f"runner.logger.log_path={tmp_path}")
    with pytest.raises(ConfigError, match="maniskill_async_ppo_openvla_tiny"):
        to_train_config(raw)
    cfg = to_train_config(_compose("maniskill_async_ppo_openvla", "cluster.device_type=cpu",
                                   f"runner.logger.log_path={tmp_path}"))
    cfg.cluster.device_type = "gpu"
    check(cfg, num_gpus=4)  # batch sizes and placement fit 4 GPUs
    with pytest.raises(ConfigError, match="on GPU 2, but this machine has 2 GPUs"):
        check(cfg, num_gpus=2)
