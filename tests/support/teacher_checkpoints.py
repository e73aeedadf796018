"""A run's checkpoint folder as ``scripts/eval.py`` and ``scripts/collect_demos.py`` load it, made
without training: ``<log>/.hydra/config.yaml`` (the composed recipe) and
``<log>/checkpoints/global_step_1`` (a randomly initialised policy, sealed by its manifest)."""

import json
import os

import torch
from conftest import REPO_ROOT
from omegaconf import OmegaConf


def make_teacher(log_dir, overrides=(), state_dim: int = 35, action_dim: int = 8, recipe="maniskill_async_ppo_mlp"):
    """The checkpoint folder of a tiny policy of ``recipe`` (+ ``overrides``) for states of
    ``state_dim`` values and actions of ``action_dim``."""
    from hydra import compose, initialize_config_dir

    from embodied_async.checkpoint_io import save_tree, write_manifest
    from embodied_async.config.hydra_schema import register_schema
    from embodied_async.config.validate import to_train_config
    from embodied_async.contracts import EnvSpec
    from embodied_async.registry import build_policy

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        raw = compose(config_name=recipe, overrides=["model.hidden_sizes=[16,16]", *overrides])
    os.makedirs(os.path.join(log_dir, ".hydra"), exist_ok=True)
    OmegaConf.save(raw, os.path.join(log_dir, ".hydra", "config.yaml"))
    cfg = to_train_config(raw)
    spec = EnvSpec(obs_shapes={"states": (state_dim,)}, obs_dtypes={"states": "float32"}, action_dim=action_dim,
                   action_low=(-1.0,) * action_dim, action_high=(1.0,) * action_dim)
    torch.manual_seed(0)
    policy = build_policy(cfg.model, spec, device=torch.device("cpu"))
    folder = os.path.join(log_dir, "checkpoints", "global_step_1")
    save_tree(dict(policy.state_dict()), folder, "model")
    with open(os.path.join(folder, "runner.json"), "w") as f:
        json.dump({"step": 1}, f)
    write_manifest(folder)
    return folder
