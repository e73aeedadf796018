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
from models.pi0.processing_pi0 import ACTION_KEY, read_normalization

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


def words(text):  # a tokenizer stand-in: BOS, one id per word, "\n"
    return [2] + [3 + sum(map(ord, w)) % 1000 for w in text.split()] + [108]


def make_policy(method, parts=("paligemma", "expert")):
    torch.manual_seed(0)
    start = 0.0 if method == "action_gaussian" else 1.0  # action_gaussian's chain starts from zero
    policy = Pi0Policy(load_pi0(FOLDER), read_normalization(FOLDER), words,
                       ChainSettings(method, 4, 5, 7, initial_noise_scale=start),
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


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise", "action_gaussian"])
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
    if method == "action_gaussian":
        assert "action_log_std" in reached
    assert all(n.startswith(("value_head.", "noise_head.", "action_log_std")) or "lora_" in n for n in trainable)


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
    with pytest.raises(ConfigError, match="model.chain_logprob=step_mean with model.noise_method=flow_sde"):
        Pi0PolicyConfig(chain_logprob="step_mean", **base).check()
    with pytest.raises(ConfigError, match="model.chain_logprob='sum'"):
        Pi0PolicyConfig(noise_method="flow_noise", chain_logprob="sum", **base).check()
    with pytest.raises(ConfigError, match="model.initial_noise_scale=1.0 with model.noise_method=action_gaussian"):
        Pi0PolicyConfig(noise_method="action_gaussian", initial_noise_scale=1.0, **base).check()
    with pytest.raises(ConfigError, match="model.action_std=0"):
        Pi0PolicyConfig(noise_method="action_gaussian", action_std=0, **base).check()
    gaussian = Pi0PolicyConfig(noise_method="action_gaussian", **base)
    gaussian.check()
    assert gaussian.chain_start_scale() == 0.0 and Pi0PolicyConfig(**base).chain_start_scale() == 1.0


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


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise", "action_gaussian"])
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


def _save_checkpoint(state, folder):
    from embodied_async.checkpoint_io import save_tree, write_manifest
    from embodied_async.run_folder import MODEL_TREE

    os.makedirs(folder)
    save_tree({name: tensor.detach().clone() for name, tensor in state.items()}, str(folder), MODEL_TREE)
    write_manifest(str(folder))


def test_rl_only_heads_start_fresh_from_a_supervised_checkpoint(tmp_path, capsys):
    """RL with flow_noise from a flow_sde supervised checkpoint: the checkpoint has no noise head (and
    no value head); the policy takes every other weight from it and keeps the heads as built. The
    other way round, the checkpoint's noise head is dropped."""
    from types import SimpleNamespace

    from embodied_async.run_folder import load_policy_weights
    from embodied_async.workers.trainer_core import load_initial_weights

    source = make_policy("flow_sde")
    with torch.no_grad():  # weights that differ from a freshly built policy's everywhere they are trained
        for name, param in source.named_parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    supervised = {n: t for n, t in source.state_dict().items() if not n.startswith("value_head.")}
    _save_checkpoint(supervised, tmp_path / "sft")
    for load in (lambda p: load_initial_weights(p, str(tmp_path / "sft"), SimpleNamespace(name="pi0")),
                 lambda p: load_policy_weights(p, str(tmp_path / "sft"), "eval")):
        target = make_policy("flow_noise")
        built = {n: t.detach().clone() for n, t in target.state_dict().items() if n.startswith(("noise_head.",
                                                                                                 "value_head."))}
        assert any(n.startswith("noise_head.") for n in built)
        load(target)
        for name, tensor in target.state_dict().items():
            expected = built[name] if name in built else supervised[name]
            assert torch.equal(tensor, expected), name
        out = capsys.readouterr().out
        assert "has no noise head (only RL trains it): it starts fresh" in out
        assert "has no value head (only RL trains it): it starts fresh" in out
    # a flow_noise RL checkpoint evaluated by a flow_sde policy: its noise head is left out
    rl_trained = make_policy("flow_noise")
    _save_checkpoint(rl_trained.state_dict(), tmp_path / "rl")
    target = make_policy("flow_sde")
    load_policy_weights(target, str(tmp_path / "rl"), "eval")
    assert torch.equal(target.value_head[0].weight, rl_trained.value_head[0].weight)
    assert "the noise head in" in capsys.readouterr().out


def test_action_gaussian_is_a_gaussian_around_the_evaluation_rule():
    """model.noise_method=action_gaussian: the chain is the deterministic ODE from zero, and only the
    executed action entries are drawn, from N(where the ODE ends, std^2): the evaluation rule is the
    policy's mean and the log-prob is that Gaussian's density."""
    from models.pi0.flow_sampling import gaussian_log_prob

    policy = make_policy("action_gaussian")
    obs = observations()
    rule = policy.predict(obs, "eval")
    torch.manual_seed(5)
    drawn = policy.predict(obs, "train")
    chain = drawn.forward_inputs["chain"]
    assert float(chain[:, 0].abs().max()) == 0.0
    ode = policy.normalization.normalize(rule.actions, ACTION_KEY, "ACTION")
    executed = chain[:, -1, :5, :7]
    std = float(policy._action_std()[0].detach())
    assert float((executed - ode).abs().max()) > 0.1 * std  # drawn, not the rule itself
    expected = gaussian_log_prob(executed, ode, std).sum(dim=(1, 2))
    torch.testing.assert_close(drawn.logprobs, expected, atol=2e-4, rtol=0)
