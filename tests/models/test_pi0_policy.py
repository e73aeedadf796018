"""Pi0Policy on the fixture's checkpoint: predict -> evaluate round trip, gradients, values."""

import os

import numpy as np
import pytest
import torch
from conftest import FIXTURES, reference_fixture

from embodied_async.contracts import Policy
from models.pi0.chain import ChainSettings
from models.pi0.modeling_pi0 import load_pi0
from models.pi0.policy_pi0 import Pi0Policy
from models.pi0.processing_pi0 import read_normalization

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


def words(text):  # a tokenizer stand-in: BOS, one id per word, "\n"
    return [2] + [3 + sum(map(ord, w)) % 1000 for w in text.split()] + [108]


def make_policy(method, parts=("paligemma", "expert")):
    torch.manual_seed(0)
    policy = Pi0Policy(load_pi0(FOLDER), read_normalization(FOLDER), words, ChainSettings(method, 4, 5, 7),
                       camera_keys=["main_images", "wrist_images"], value_head_hidden_sizes=(16,), lora_rank=4,
                       lora_targets=["q_proj", "v_proj", "gate_proj", "fc1"], lora_parts=list(parts),
                       gradient_checkpointing=True)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # adapters start as a no-op (B = 0): make them matter
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    return policy


def observations(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"main_images": rng.integers(0, 256, (batch, 128, 128, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (batch, 96, 128, 3), dtype=np.uint8),
            "states": rng.normal(size=(batch, 9)).astype(np.float32), "task_descriptions": ["push the cube"] * batch}


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
def test_evaluate_re_scores_what_predict_drew_and_gradients_reach_only_the_trainable(method):
    policy = make_policy(method)
    assert isinstance(policy, Policy)
    out = policy.predict(observations())
    assert out.actions.shape == (3, 5, 7) and torch.isfinite(out.logprobs).all()
    policy.train()
    logprobs, entropy, values = policy.evaluate(out.forward_inputs)
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(values, out.values, atol=1e-5, rtol=0)
    (logprobs.sum() + values.sum() + entropy.sum()).backward()
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    reached = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert not {n for n, p in policy.named_parameters() if not p.requires_grad and p.grad is not None}
    assert any("paligemma" in n and "lora_A" in n for n in reached) and any("gemma_expert" in n and "lora_A" in n
                                                                           for n in reached)
    assert any(n.startswith("value_head.") for n in reached)
    if method == "flow_noise":
        assert any(n.startswith("noise_head.") for n in reached)
    assert all(n.startswith(("value_head.", "noise_head.")) or "lora_" in n for n in trainable)


def test_lora_on_the_expert_alone_leaves_paligemma_frozen_and_values_are_observation_only():
    policy = make_policy("flow_sde", parts=("expert",))
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".paligemma." in n)
    obs = observations(seed=4)
    first, second = policy.predict(obs), policy.predict(obs)
    assert not torch.equal(first.forward_inputs["chain"], second.forward_inputs["chain"])  # new noise each call
    torch.testing.assert_close(first.values, second.values)  # the value does not depend on the noise
    torch.testing.assert_close(policy.value(obs), first.values)
    evaluation = policy.predict(obs, mode="eval")  # deterministic sampler
    assert (evaluation.forward_inputs["stochastic_step"] == -1).all()


def test_bfloat16_compute_samples_and_re_scores_in_float32():
    torch.manual_seed(0)
    model = load_pi0(FOLDER, dtype=torch.bfloat16)
    policy = Pi0Policy(model, read_normalization(FOLDER), words, ChainSettings("flow_sde", 4, 5, 7),
                       camera_keys=["main_images"], value_head_hidden_sizes=(16,))
    out = policy.predict(observations())
    assert out.forward_inputs["chain"].dtype == torch.float32 and torch.isfinite(out.logprobs).all()
    logprobs, _, values = policy.evaluate(out.forward_inputs)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-4, rtol=0)
    torch.testing.assert_close(values, out.values, atol=1e-3, rtol=0)


def test_config_refuses_what_cannot_train(tmp_path):
    from embodied_async.config import ConfigError
    from models.pi0.configuration_policy import Pi0PolicyConfig

    base = dict(path=str(tmp_path / "tiny"), tiny_random_init=True)
    Pi0PolicyConfig(**base).check()
    with pytest.raises(ConfigError, match="flow_ode draws no stochastic step"):
        Pi0PolicyConfig(noise_method="flow_ode", **base).check()
    bad_lora = Pi0PolicyConfig(**base)
    bad_lora.lora.dropout = 0.1
    with pytest.raises(ConfigError, match="dropout"):
        bad_lora.check()


def test_an_absent_camera_left_out_gives_what_lerobots_masked_blank_image_gives():
    from models.pi0.processing_pi0 import camera_images

    policy = make_policy("flow_sde")  # the fixture has 3 cameras; the env gives 2: the third is absent
    model = policy.model
    with torch.no_grad():
        inputs = policy.observation_inputs(observations())
        (cache, pad), hidden = policy._prefix(inputs)
        batch = inputs["state"].shape[0]
        blank = torch.full((batch, 3, 224, 224), -1.0)
        images = [camera_images(inputs["camera_0"], 224, 224), camera_images(inputs["camera_1"], 224, 224), blank]
        masks = [torch.ones(batch, dtype=torch.bool)] * 2 + [torch.zeros(batch, dtype=torch.bool)]
        ref_cache, ref_hidden = model.run_prefix(*model.embed_prefix(images, masks, inputs["tokens"],
                                                                     inputs["token_mask"]))
        ref_pad = torch.cat([m[:, None].expand(batch, 256) for m in masks] + [inputs["token_mask"]], dim=1)
        x_t, time = torch.randn(batch, 50, 32, generator=torch.Generator().manual_seed(3)), torch.full((batch,), 0.6)
        velocity = model.run_suffix(cache, pad, inputs["state"], x_t, time)[0]
        reference = model.run_suffix(ref_cache, ref_pad, inputs["state"], x_t, time)[0]
    assert pad.shape[1] == ref_pad.shape[1] - 256  # the blank camera's tokens were never computed
    scale = reference.abs().max()
    assert (velocity - reference).abs().max() <= 1e-5 * scale
    # the valid tokens' hidden states (what the prefix value head averages); masked rows attend to nothing
    kept = torch.cat([ref_hidden[:, :512], ref_hidden[:, 768:]], dim=1)[pad]
    torch.testing.assert_close(hidden[pad], kept, atol=1e-5 * float(kept.abs().max()), rtol=0)


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
def test_token_level_log_probs_are_the_executed_entries_of_the_decision_log_prob(method):
    """algorithm.logprob_type=token_level: one log-prob per executed action entry (5 actions x 7
    dimensions), predict and evaluate agree, and they sum to the decision's log-prob."""
    policy = make_policy(method)
    policy.logprob_type = "token_level"
    torch.manual_seed(3)
    out = policy.predict(observations())
    assert out.logprobs.shape == (3, 5 * 7)
    logprobs, entropy, _ = policy.evaluate(out.forward_inputs)
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=0)
    assert entropy.shape == (3,)
    policy.logprob_type = "chunk_level"
    decision, _, _ = policy.evaluate(out.forward_inputs)
    torch.testing.assert_close(logprobs.sum(1), decision, atol=1e-4, rtol=0)


def test_a_zero_initial_noise_scale_starts_every_chain_from_zero():
    """model.initial_noise_scale=0: the flow integrates from zero, so the ODE rule is deterministic
    and a sampled chain's only randomness is its stochastic step (the part its log-prob credits)."""
    policy = make_policy("flow_sde")
    policy.settings = ChainSettings("flow_sde", 4, 5, 7, initial_noise_scale=0.0)
    obs = observations()
    first, second = policy.predict(obs, "eval"), policy.predict(obs, "eval")
    torch.testing.assert_close(first.actions, second.actions)
    drawn = policy.predict(obs, "train")
    assert float(drawn.forward_inputs["chain"][:, 0].abs().max()) == 0.0
    logprobs, _, _ = policy.evaluate(drawn.forward_inputs)
    torch.testing.assert_close(logprobs, drawn.logprobs, atol=1e-5, rtol=0)
    policy.settings = ChainSettings("flow_sde", 4, 5, 7)
    assert float(policy.predict(obs, "train").forward_inputs["chain"][:, 0].abs().max()) > 0.5
