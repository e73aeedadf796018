"""Composing a config from a recipe name, a model or a run's checkpoint (``config.recipes``), as
every script does."""

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from embodied_async.checkpoint_io import write_manifest
from embodied_async.config import ConfigError
from embodied_async.config.recipes import (
    apply_overrides,
    check_recipe_name,
    compose_recipe,
    model_config,
    model_family,
    target_config,
)

FIXTURES = os.path.join(os.path.dirname(REPO_ROOT), "shared", "fixtures")


def test_a_renamed_recipe_is_refused_with_its_new_name():
    check_recipe_name("maniskill_async_ppo_pi0_tiny")
    with pytest.raises(ConfigError, match="'maniskill_async_ppo_openpi_tiny' is now 'maniskill_async_ppo_pi0_tiny'"):
        compose_recipe("maniskill_async_ppo_openpi_tiny")
    with pytest.raises(ConfigError, match="no recipe 'nonsense'.*maniskill_async_ppo_mlp"):
        compose_recipe("nonsense")
    entry = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
    proc = subprocess.run([sys.executable, entry, "--config-name", "maniskill_sft_openpi", "runner.dry_run=true"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 2 and "is now 'maniskill_sft_pi0'" in proc.stderr


def test_the_family_of_a_model_is_what_its_config_class_recognises():
    assert model_family(os.path.join(FIXTURES, "openvla_tiny_a")) == "openvla"
    assert model_family(os.path.join(FIXTURES, "pi0_tiny_lerobot")) == "pi0"
    assert model_family("lerobot/pi0_base") == "pi0" and model_family("openvla/openvla-7b") == "openvla"
    with pytest.raises(ConfigError, match="cannot tell which policy family"):
        model_family("someone/a-policy")
    cfg = model_config(os.path.join(FIXTURES, "pi0_tiny_lerobot"), None, ["runner.seed=3"])
    assert cfg.model.name == "pi0" and cfg.model.path.endswith("pi0_tiny_lerobot") and cfg.runner.seed == 3


def test_a_checkpoint_is_composed_from_its_runs_saved_config(tmp_path):
    from omegaconf import OmegaConf

    checkpoint = tmp_path / "run" / "checkpoints" / "global_step_3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "runner.json").write_text('{"step": 3}')
    write_manifest(str(checkpoint))
    with pytest.raises(ConfigError, match="its run's config .*config.yaml is missing: name the recipe"):
        target_config(str(checkpoint))
    raw, found = target_config(str(checkpoint), ["runner.seed=4"], recipe="maniskill_async_ppo_mlp")  # named instead
    assert found == str(checkpoint) and raw.model.name == "mlp" and raw.runner.seed == 4
    saved = compose_recipe("maniskill_async_ppo_mlp", ["env.num_action_chunks=2"])
    os.makedirs(tmp_path / "run" / ".hydra")
    OmegaConf.save(saved, tmp_path / "run" / ".hydra" / "config.yaml")
    raw, found = target_config(str(checkpoint), ["runner.seed=5", "env=robosuite_reach"])
    assert found == str(checkpoint) and raw.runner.seed == 5
    # a new env keeps the chunk the policy was trained to execute
    assert raw.env.name == "robosuite" and raw.env.num_action_chunks == 2
    (tmp_path / "run" / "checkpoints" / "latest").write_text("global_step_3\n")
    for folder in (tmp_path / "run", tmp_path / "run" / "checkpoints"):
        with pytest.raises(ConfigError, match="not a checkpoint but holds a run's checkpoints: .*global_step_3"):
            target_config(str(folder))
    with pytest.raises(ConfigError, match="env=nowhere: no configs/env/nowhere.yaml"):
        apply_overrides(raw, ["env=nowhere"])
