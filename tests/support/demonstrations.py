"""Demonstrations for tests: random episodes shaped like an env (written by our writer), and
the tiny VLA SFT recipes run on them."""

import json
import os

import numpy as np
from conftest import REPO_ROOT, run_recipe
from hydra import compose, initialize_config_dir

from embodied_async.config.hydra_schema import register_schema
from embodied_async.config.validate import to_train_config
from embodied_async.datasets.batches import CONVENTIONAL_KEYS, dataset_features
from embodied_async.datasets.writer import DatasetWriter
from embodied_async.registry import build_env

SFT_OVERRIDES = ("runner.max_steps=4", "runner.val_check_interval=4", "runner.eval_episodes=2",
                 "runner.eval_num_envs=2", "runner.save_interval=4", "sft.lr_warmup_steps=2",
                 "actor.global_batch_size=4", "actor.micro_batch_size=2", "dataset.validation_fraction=0.25")


def random_demonstrations(root, env_cfg, episodes=4, length=6):
    env = build_env(env_cfg, 1, 0)
    spec = env.spec
    env.close()
    rng = np.random.default_rng(0)
    features = dataset_features(spec)
    with DatasetWriter(root, int(spec.control_hz or 20), features) as writer:
        for e in range(episodes):
            frames = {}
            for name, key in CONVENTIONAL_KEYS.items():
                if key not in features:
                    continue
                shape = [length, *features[key]["shape"]]
                frames[key] = rng.integers(0, 256, shape, dtype=np.uint8) if features[key]["dtype"] == "video" \
                    else rng.uniform(-1, 1, shape).astype(np.float32)
            writer.add_episode(frames, spec.instruction or "push the cube to the goal", seed=e)
    return root


def run_tiny_sft(family: str, tmp_path, *overrides: str):
    """The family's tiny SFT recipe for 4 steps on random demonstrations shaped like its env (with
    ``overrides``, e.g. another env=); returns its last checkpoint and its records."""
    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        env_cfg = to_train_config(compose(config_name=f"maniskill_sft_{family}_tiny", overrides=list(overrides))).env
    root = random_demonstrations(str(tmp_path / "demos"), env_cfg)
    log_path = tmp_path / "sft"
    _, records = run_recipe(f"maniskill_sft_{family}_tiny", log_path, f"dataset.root={root}", *SFT_OVERRIDES,
                            *overrides)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["train/sft/loss"]) for r in records) and "val/sft/loss" in records[-1]
    checkpoint = log_path / "checkpoints" / "global_step_4"
    with open(checkpoint / "model_info.json") as f:
        assert json.load(f)["family"] == family
    return checkpoint, records


def recipe_env_config(config_name: str, *overrides: str):
    """The env config of recipe ``config_name`` (with ``overrides``): demonstrations shaped like
    the env a recipe's run checks its dataset against."""
    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        return to_train_config(compose(config_name=config_name, overrides=list(overrides))).env
