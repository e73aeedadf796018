"""The tiny OpenVLA recipes: SFT on demonstrations, then async PPO with the VLA (LoRA adapters +
value head) starting from that checkpoint (model.init_from), on a real env, here a MuJoCo task
chosen by overriding only env= (the recipes' own ManiSkill env runs in the Pi0 tiny recipes'
test, which shares its env YAML)."""

import os

import pytest

from conftest import assert_logs_every_recipe_metric, run_recipe
from demonstrations import run_tiny_sft


@pytest.mark.slow
def test_tiny_openvla_recipes_sft_then_two_async_updates_from_its_checkpoint(tmp_path):
    checkpoint, sft_records = run_tiny_sft("openvla", tmp_path, "env=fetch_reach")
    assert "train/sft/token_accuracy" in sft_records[-1] and "eval/success_rate" in sft_records[-1]
    log_path = tmp_path / "run"
    _, records = run_recipe("maniskill_async_ppo_openvla_tiny", log_path, "env=fetch_reach",
                            f"model.init_from={checkpoint}")
    # the checkpoint was made in the official format at model.path and loaded back by path
    assert os.path.isfile(log_path / "tiny_openvla" / "model.safetensors")
    assert [r["train/actor/current_version"] for r in records] == [0.0, 1.0]
    assert "eval/success_rate" in records[-1]
    assert_logs_every_recipe_metric(records[-1])  # every metric the other recipes log
    # the rollout swapped in weights the actor published (adapters + value head only under LoRA);
    # it needs version 1 before it may collect the third batch, i.e. before update 2 can end
    assert records[-1]["eval/version"] >= 1.0
