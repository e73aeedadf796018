"""Denoising chains on the fixture's Pi0: the ODE chain is the reference sampler's, and re-scoring
a stored stochastic chain under unchanged weights gives back the rollout's log-probs."""

import os

import numpy as np
import pytest
import torch
from conftest import FIXTURES, reference_fixture

from models.pi0.chain import ChainSettings, chain_log_prob, sample_chain
from models.pi0.modeling_pi0 import load_pi0

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


@pytest.fixture(scope="module")
def setup():
    model = load_pi0(FOLDER)
    inputs, expected = np.load(os.path.join(FOLDER, "inputs.npz")), np.load(os.path.join(FOLDER, "expected.npz"))
    ref = {**{k: torch.from_numpy(inputs[k]) for k in inputs}, **{k: torch.from_numpy(expected[k]) for k in expected}}
    with torch.no_grad():
        embs, pad, blocks = model.embed_prefix([ref[f"model_in.image{i}"] for i in range(3)],
                                               [ref[f"model_in.image{i}_mask"] for i in range(3)],
                                               ref["observation.language.tokens"],
                                               ref["observation.language.attention_mask"])
        prefix = (model.run_prefix(embs, pad, blocks)[0], pad)
    torch.manual_seed(0)
    noise_head = torch.nn.Linear(model.arch.expert.width, model.arch.max_action_dim)
    return model, prefix, ref, noise_head


def settings(method, steps=10):
    return ChainSettings(method=method, steps=steps, executed_actions=5, action_dim=7)


def test_flow_ode_chain_is_the_reference_sampler(setup):
    model, prefix, ref, _ = setup
    with torch.no_grad():
        out = sample_chain(model, prefix, ref["model_in.state_padded"], ref["noise_sample"], settings("flow_ode"))
    torch.testing.assert_close(out["chain"].transpose(0, 1), ref["sample.x_t"], atol=2e-4, rtol=0)
    assert (out["stochastic_step"] == -1).all() and (out["logprob"] == 0).all()


def action_std(model):
    return torch.full((model.arch.max_action_dim,), 0.1)


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise", "action_gaussian"])
def test_rescoring_a_stored_chain_reproduces_its_logprob(setup, method):
    model, prefix, ref, noise_head = setup
    gen = torch.Generator().manual_seed(3)
    cfg = settings(method, steps=4)
    with torch.no_grad():
        out = sample_chain(model, prefix, ref["model_in.state_padded"], ref["noise_sample"], cfg, noise_head, gen,
                           action_std=action_std(model))
    logprob, entropy = chain_log_prob(model, prefix, ref["model_in.state_padded"], out["chain"],
                                      out["stochastic_step"], cfg, noise_head, action_std=action_std(model))
    assert torch.isfinite(out["logprob"]).all() and (out["logprob"] != 0).all()
    torch.testing.assert_close(logprob, out["logprob"], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, out["entropy"], atol=1e-5, rtol=0)
    if method == "flow_sde":  # one stochastic step per sample; the rest of the chain is Euler
        assert ((out["stochastic_step"] >= 0) & (out["stochastic_step"] < 4)).all()
    # a chain drawn by other weights scores differently: the log-prob depends on the weights
    with torch.no_grad():
        model.action_out_proj.bias.add_(0.5)
        moved, _ = chain_log_prob(model, prefix, ref["model_in.state_padded"], out["chain"], out["stochastic_step"],
                                  cfg, noise_head, action_std=action_std(model))
        model.action_out_proj.bias.sub_(0.5)
    assert (moved - out["logprob"]).abs().min() > 1e-3


def _euler_step(model, prefix, state, x, k, cfg):
    from models.pi0.flow_sampling import euler_mean

    time = cfg.times()[k].expand(x.shape[0])
    velocity, _ = model.run_suffix(*prefix, state, x, time)
    return euler_mean(x.float(), velocity.float(), cfg.step_size)


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise", "action_gaussian"])
def test_noise_enters_the_executed_entries_alone(setup, method):
    """Every step of a sampled chain is the deterministic Euler step outside the executed entries
    (first 5 actions, 7 real dimensions): no randomness the log-prob leaves out reaches the env's
    actions through attention in later steps. Inside them, the stochastic steps moved off it."""
    model, prefix, ref, noise_head = setup
    cfg = settings(method, steps=4)
    state = ref["model_in.state_padded"]
    with torch.no_grad():
        out = sample_chain(model, prefix, state, ref["noise_sample"], cfg, noise_head,
                           torch.Generator().manual_seed(4), action_std=action_std(model))
        chain, executed_moved = out["chain"], 0.0
        for k in range(cfg.steps):
            euler = _euler_step(model, prefix, state, chain[:, k], k, cfg)
            off = chain[:, k + 1] - euler
            outside = off.clone()
            outside[:, :5, :7] = 0
            assert float(outside.abs().max()) < 1e-5, k
            executed_moved = max(executed_moved, float(off[:, :5, :7].abs().max()))
    assert executed_moved > 0.01


def test_the_per_step_mean_is_the_joint_log_prob_over_the_steps(setup):
    """flow_noise's chain_logprob=step_mean: RLinf's joint_logprob=false, the joint divided by the steps."""
    model, prefix, ref, noise_head = setup
    joint, mean = settings("flow_noise", steps=4), ChainSettings("flow_noise", 4, 5, 7, chain_logprob="step_mean")
    state = ref["model_in.state_padded"]
    with torch.no_grad():
        out = sample_chain(model, prefix, state, ref["noise_sample"], joint, noise_head,
                           torch.Generator().manual_seed(2))
        averaged = sample_chain(model, prefix, state, ref["noise_sample"], mean, noise_head,
                                torch.Generator().manual_seed(2))
        rescored, _ = chain_log_prob(model, prefix, state, out["chain"], out["stochastic_step"], mean, noise_head)
    torch.testing.assert_close(averaged["logprob"], out["logprob"] / 4, atol=1e-5, rtol=0)
    torch.testing.assert_close(rescored, out["logprob"] / 4, atol=1e-5, rtol=0)
