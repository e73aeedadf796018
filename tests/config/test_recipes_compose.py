"""Every recipe in configs/ composes and passes the start-up checks (the GPU ones as if their GPUs
were there), so a recipe no test runs cannot rot unseen."""

import glob
import os

import pytest
from conftest import REPO_ROOT
from hydra import compose, initialize_config_dir

from embodied_async.config import resolve
from embodied_async.config.hydra_schema import register_schema

RECIPES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(REPO_ROOT, "configs", "*.yaml")))


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_recipe_composes_and_passes_the_start_up_checks(recipe):
    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        cfg = compose(config_name=recipe)
    train_cfg, topology = resolve(cfg, num_gpus=8)
    assert train_cfg.runner.logger.log_path.endswith(recipe)  # each recipe logs under its own name
    assert topology.actor_world_size >= 1


def test_the_miniature_recipes_of_a_family_build_the_same_model():
    """model.init_from takes the SFT checkpoint into the RL run only when both build one shape."""
    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        for family in ("openvla", "pi0"):
            sft, rl = (resolve(compose(config_name=f"maniskill_miniature_{phase}_{family}"))[0]
                       for phase in ("sft", "ppo"))
            # what decides the weights' names and shapes (sampling settings may differ)
            shape = ("name", "tiny_random_init", "tiny_image_size", "lora", "value_head_hidden_sizes", "value_input")
            assert {k: getattr(sft.model, k) for k in shape} == {k: getattr(rl.model, k) for k in shape}, family
            assert sft.env.num_action_chunks == rl.env.num_action_chunks and sft.env.task == rl.env.task
