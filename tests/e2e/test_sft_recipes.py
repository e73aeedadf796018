"""A supervised run end to end: an MLP's SFT checkpoint starts PPO with its weights and statistics
(the tiny VLA recipes' tests run SFT, then RL from its checkpoint, the same way)."""

import numpy as np
import pytest
import torch
from conftest import build_config
from demonstrations import random_demonstrations

from embodied_async.checkpoint_io import load_tree
from embodied_async.datasets.reader import DatasetReader

pytestmark = pytest.mark.slow
LOCAL = "cluster.backend=local"  # the whole graph in this process: no Ray start-up


def test_rl_starts_from_the_sft_weights_and_statistics(tmp_path):
    """An MLP fitted to demonstrations, then one PPO update at a negligible learning rate: the
    actor's weights are the SFT checkpoint's, and so are the observation statistics it started
    from (the dataset's), merged with what the rollout saw since."""
    from embodied_async.runner import run

    root = random_demonstrations(str(tmp_path / "demos"), build_config(tmp_path / "probe").env, episodes=6, length=8)
    # SFT under FSDP2 with bf16 compute, a validation loss (forward passes without a backward)
    # right before each checkpoint
    run(build_config(tmp_path / "sft", "runner.mode=sft", f"dataset.root={root}", "runner.max_steps=6", LOCAL,
                     "runner.val_check_interval=3", "runner.save_interval=3", "actor.lr=3e-3",
                     "model.precision=bfloat16"))
    checkpoint = tmp_path / "sft" / "logs" / "checkpoints" / "global_step_6"
    sft_state = load_tree(str(checkpoint), "model")
    # resumed at step 3, the run takes the same batches and steps: the same weights at step 6
    halfway = tmp_path / "sft" / "logs" / "checkpoints" / "global_step_3"
    run(build_config(tmp_path / "resumed", "runner.mode=sft", f"dataset.root={root}", "runner.max_steps=6", LOCAL,
                     "runner.val_check_interval=3", "runner.save_interval=3", "actor.lr=3e-3",
                     "model.precision=bfloat16", f"runner.resume_dir={halfway}"))
    resumed = load_tree(str(tmp_path / "resumed" / "logs" / "checkpoints" / "global_step_6"), "model")
    for name, value in sft_state.items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=1e-5)
    rl_cfg = build_config(tmp_path / "rl", f"model.init_from={checkpoint}", "runner.max_steps=1", LOCAL,
                          "runner.val_check_interval=0", "actor.lr=1e-12", "actor.critic_warmup_steps=0")
    run(rl_cfg)
    rl_state = load_tree(str(tmp_path / "rl" / "logs" / "checkpoints" / "global_step_1"), "model")
    for name in ("actor.0.weight", "actor.2.bias", "head.log_std"):
        torch.testing.assert_close(rl_state[name], sft_state[name], atol=1e-6, rtol=0)
    stats = DatasetReader(root).stats["observation.state"]
    np.testing.assert_allclose(sft_state["normalizer.mean"].numpy(), stats["mean"], rtol=1e-6)
    assert float(sft_state["normalizer.count"]) == 6 * 8
    assert float(rl_state["normalizer.count"]) > 6 * 8  # the rollout's observations merged on top
