"""Every recipe in configs/ composes and passes the start-up checks (the GPU ones as if their GPUs
were there), so a recipe no test runs cannot rot unseen."""

import glob
import os

import pytest
from conftest import REPO_ROOT
from hydra import compose, initialize_config_dir

from embodied_async.config import resolve
from embodied_async.config.hydra_schema import register_schema
from embodied_async.config.recipes import compose_recipe

RECIPES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(REPO_ROOT, "configs", "*.yaml")))


def needs_libero(recipe: str) -> bool:
    """A LIBERO recipe's start-up checks ask LIBERO in its own environment (.venv-libero, built on
    first use): those cases are slow, so the fast tier builds no family environment."""
    return recipe.startswith("libero_")


@pytest.mark.parametrize("recipe", [pytest.param(r, marks=pytest.mark.slow) if needs_libero(r) else r for r in RECIPES])
def test_the_recipe_composes_and_passes_the_start_up_checks(recipe, request):
    if needs_libero(recipe):
        request.getfixturevalue("libero_python_env")
    train_cfg, topology = resolve(compose_recipe(recipe), num_gpus=8)
    assert train_cfg.runner.logger.log_path == f"logs/{recipe}"  # each recipe logs under its own name
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


def test_a_recipe_states_neither_its_log_folder_nor_hydras_settings():
    """Both come from one place (config.recipes.with_log_path, the train_schema node), so a copied
    recipe cannot log into the folder of the one it was copied from."""
    for recipe in RECIPES:
        with open(os.path.join(REPO_ROOT, "configs", f"{recipe}.yaml")) as f:
            text = f.read()
        assert "log_path" not in text and "\nhydra:" not in text, recipe
    raw = compose_recipe("maniskill_ppo_mlp", ["runner.logger.log_path=logs/mine"])
    assert raw.runner.logger.log_path == "logs/mine"
