"""Pi0Policy on the fixture's checkpoint: predict -> evaluate round trip, gradients, values."""

import os

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from embodied_async.contracts import Policy
from models.pi0.chain import ChainSettings
from models.pi0.modeling_pi0 import load_pi0
from models.pi0.policy_pi0 import Pi0Policy
from models.pi0.processing_pi0 import read_normalization

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")
pytestmark = pytest.mark.skipif(not os.path.isdir(FOLDER), reason="Pi0 fixture not available")


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
