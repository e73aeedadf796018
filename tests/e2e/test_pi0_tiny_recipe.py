"""The tiny Pi0 recipes: SFT (flow matching) on demonstrations, then async PPO with the VLA (LoRA +
value head) starting from that checkpoint (model.init_from), on a real env."""

import os

import pytest
from conftest import assert_logs_every_recipe_metric, run_recipe
from demonstrations import run_tiny_sft

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess




# the log-probs that cover the policy (issue 47), from the flow_sde SFT checkpoint: flow_noise's
# noise head and action_gaussian's std start fresh (only RL has them), and the anchor to the warm start;
# with action_gaussian, the RL levers of issue 32: chains from zero, a ratio per action entry, the
# vision-language model frozen while the expert trains (its LoRA adapters here)
NOISE_HEAD = ("model.noise_method=flow_noise", "model.chain_logprob=step_mean", "algorithm.anchor_kl_coef=0.1")
ACTION_GAUSSIAN = ("model.noise_method=action_gaussian", "algorithm.logprob_type=token_level",
                   "model.initial_noise_scale=0",
                   "actor.frozen_parameter_prefixes=[model.paligemma_with_expert.paligemma.]")


@pytest.fixture(scope="module")
def sft_checkpoint(tmp_path_factory):
    checkpoint, sft_records = run_tiny_sft("pi0", tmp_path_factory.mktemp("pi0_sft"))
    assert "train/sft/flow_loss" in sft_records[-1]
    return checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("levers", [(), NOISE_HEAD, ACTION_GAUSSIAN], ids=["defaults", "noise_head", "action_gaussian"])
def test_tiny_pi0_recipes_sft_then_two_async_updates_from_its_checkpoint(tmp_path, sft_checkpoint, levers):
    checkpoint = sft_checkpoint
    log_path = tmp_path / "run"
    proc, records = run_recipe("maniskill_async_ppo_pi0_tiny", log_path, f"model.init_from={checkpoint}", *levers)
    # the checkpoint was made in LeRobot's format at model.path and loaded back by path
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "meta.json"} <= set(
        os.listdir(log_path / "tiny_pi0"))
    assert [r["train/actor/current_version"] for r in records] == [0.0, 1.0]
    last = records[-1]
    assert_logs_every_recipe_metric(records[-1])  # every metric the other recipes log
    assert "eval/success_rate" in last and last["eval/version"] >= 1.0
    for key in ("train/actor/policy_loss", "train/critic/value_loss", "train/actor/behav_approx_kl",
                "train/actor/grad_norm"):
        assert isinstance(last[key], float) and last[key] == last[key], key  # logged and not NaN
    # 5 of each 10-action chunk executed per decision (fewer where an episode ended part-way): the
    # first update's 8 decisions (2 sub-envs x 4 steps), with at most twice as many run ahead under
    # staleness 1, are more env steps than decisions and at most 5 each
    assert 16 < records[0]["env_steps"] <= 5 * 8 * 3 and last["train/actor/published_bytes"] > 0
    if "algorithm.anchor_kl_coef=0.1" in levers:
        assert last["train/actor/anchor_kl"] >= 0.0
    for head, method in (("noise head", "flow_noise"), ("action log std", "action_gaussian")):
        fresh = f"has no {head} (only RL trains it): it starts fresh"
        assert (fresh in proc.stdout + proc.stderr) == (f"model.noise_method={method}" in levers), head
