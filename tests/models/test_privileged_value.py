"""model.value_input=privileged_states (OpenVLA, Pi0): an asymmetric critic. The value head reads
the env's privileged state vector while actions come from the image, instruction and
proprioception alone; rollout, actor and bootstrap compute the same values; evaluation and the
supervised loss need no privileged state. And model.add_value_head=false: no critic at all."""

import numpy as np
import pytest
import torch

from embodied_async.contracts import EnvSpec
from embodied_async.registry import build_policy
from models.mlp.configuration_mlp import MLPConfig
from models.openvla.configuration_policy import OpenVLAPolicyConfig
from models.pi0.configuration_policy import Pi0PolicyConfig

STATE_DIM = 31


def spec(privileged=True):
    shapes = {"main_images": (64, 64, 3), **({"privileged_states": (STATE_DIM,)} if privileged else {})}
    dtypes = {"main_images": "uint8", **({"privileged_states": "float32"} if privileged else {})}
    return EnvSpec(obs_shapes=shapes, obs_dtypes=dtypes, action_dim=4, action_low=(-1.0,) * 4,
                   action_high=(1.0,) * 4)


def config(folder, value_input="privileged_states"):
    cfg = OpenVLAPolicyConfig(path=folder, tiny_random_init=True, unnorm_key="tiny", value_head_hidden_sizes=[16],
                              tiny_image_size=112, value_input=value_input)
    cfg.lora.enabled = False
    return cfg


def observations(seed, batch=3):
    rng = np.random.default_rng(seed)
    return {"main_images": rng.integers(0, 256, (batch, 64, 64, 3), dtype=np.uint8),
            "privileged_states": rng.normal(size=(batch, STATE_DIM)).astype(np.float32),
            "task_descriptions": ["push the cube to the goal"] * batch}


def test_values_read_the_privileged_states_and_actions_do_not(tmp_path):
    policy = build_policy(config(str(tmp_path / "tiny")), spec())
    obs = observations(0)
    torch.manual_seed(0)
    out = policy.predict(obs)
    logprobs, _, values = policy.evaluate(out.forward_inputs)
    assert torch.allclose(logprobs, out.logprobs, atol=1e-4)
    assert torch.allclose(values, out.values, atol=1e-5) and torch.allclose(policy.value(obs), out.values, atol=1e-5)
    other = dict(obs, privileged_states=observations(1)["privileged_states"])
    torch.manual_seed(0)
    moved = policy.predict(other)
    assert torch.equal(moved.forward_inputs["action_tokens"], out.forward_inputs["action_tokens"])
    assert not torch.allclose(moved.values, out.values)
    # value-head parameters are the ones the value learning rate and the critic warm-up act on
    heads = [n for n, _ in policy.named_parameters() if n.startswith(policy.value_parameter_prefixes)]
    assert heads and all("vla." not in n for n in heads)


def test_privileged_values_without_privileged_states_are_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="env.privileged_states=true"):
        build_policy(config(str(tmp_path / "tiny")), spec(privileged=False))


# ---- both VLA families ----------------------------------------------------------------------

def family_spec(family, privileged=True):
    shapes = {"main_images": (64, 64, 3), **({"states": (8,)} if family == "pi0" else {}),
              **({"privileged_states": (STATE_DIM,)} if privileged else {})}
    return EnvSpec(obs_shapes=shapes, obs_dtypes={k: "uint8" if k == "main_images" else "float32" for k in shapes},
                   action_dim=4, action_low=(-1.0,) * 4, action_high=(1.0,) * 4)


def family_config(family, folder, value_input="privileged_states", add_value_head=None):
    if family == "openvla":
        cfg = config(folder, value_input)
    else:
        cfg = Pi0PolicyConfig(path=folder, tiny_random_init=True, tokenizer="words", value_head_hidden_sizes=[16],
                              tiny_image_size=112, value_input=value_input, num_steps=2, camera_keys=["main_images"])
        cfg.lora.enabled = False
    cfg.add_value_head = add_value_head
    return cfg


def family_observations(family, seed, batch=3):
    obs = observations(seed, batch)
    if family == "pi0":
        obs["states"] = np.random.default_rng(seed + 7).normal(size=(batch, 8)).astype(np.float32)
    return obs


def drawn(family, out):
    """What identifies the drawn action: OpenVLA's tokens, Pi0's denoising chain."""
    return out.forward_inputs["action_tokens" if family == "openvla" else "chain"]


@pytest.mark.parametrize("family", ["openvla", "pi0"])
def test_the_state_moves_the_values_and_never_the_action_distribution(tmp_path, family):
    policy = build_policy(family_config(family, str(tmp_path / "tiny")), family_spec(family))
    obs = family_observations(family, 0)
    other = dict(obs, privileged_states=observations(1)["privileged_states"])
    torch.manual_seed(0)
    out = policy.predict(obs)
    torch.manual_seed(0)
    moved = policy.predict(other)
    assert torch.equal(drawn(family, moved), drawn(family, out))  # the same draw from the same noise
    torch.testing.assert_close(moved.logprobs, out.logprobs, atol=1e-5, rtol=0)
    assert not torch.allclose(moved.values, out.values)
    torch.testing.assert_close(policy.value(obs), out.values, atol=1e-5, rtol=0)
    # re-scored with another state: the same log-probs and entropy, other values
    logprobs, entropy, values = policy.evaluate(out.forward_inputs)
    swapped = dict(out.forward_inputs, privileged_states=moved.forward_inputs["privileged_states"])
    logprobs_2, entropy_2, values_2 = policy.evaluate(swapped)
    torch.testing.assert_close(logprobs_2, logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_2, entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(values, out.values, atol=1e-4, rtol=0)
    assert not torch.allclose(values_2, values)


@pytest.mark.parametrize("family", ["openvla", "pi0"])
def test_the_privileged_critic_trains_and_its_loss_reaches_no_policy_weight(tmp_path, family):
    policy = build_policy(family_config(family, str(tmp_path / "tiny")), family_spec(family)).train()
    out = policy.predict(family_observations(family, 0, batch=4))
    target = out.forward_inputs["privileged_states"][:, 0]  # a return the state explains
    heads = [p for n, p in policy.named_parameters() if n.startswith(policy.value_parameter_prefixes)]
    optimizer = torch.optim.Adam(heads, lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(policy.evaluate(out.forward_inputs)[2], target)
        loss.backward()
        losses.append(loss.item())
        moved = lambda p: p.grad is not None and bool(p.grad.abs().sum() > 0)  # noqa: E731
        heads_only = policy.value_parameter_prefixes
        others = [n for n, p in policy.named_parameters() if not n.startswith(heads_only) and moved(p)]
        assert not others, others[:3]  # the critic's loss moves the value head alone
        optimizer.step()
    assert losses[-1] < 0.2 * losses[0]


@pytest.mark.parametrize("family", ["openvla", "pi0"])
def test_evaluation_and_the_supervised_loss_run_without_the_privileged_state(tmp_path, family):
    policy = build_policy(family_config(family, str(tmp_path / "tiny")), family_spec(family))
    obs = family_observations(family, 0)
    del obs["privileged_states"]
    out = policy.predict(obs, mode="eval")
    assert out.actions.shape[0] == 3 and torch.equal(out.values, torch.zeros(3))
    horizon = policy.supervised_horizon
    losses, _ = policy.supervised_loss(obs, torch.zeros(3, horizon, 4), torch.zeros(3, horizon, dtype=torch.bool))
    assert torch.isfinite(losses).all()
    with pytest.raises(KeyError, match="env.privileged_states=true"):
        policy.predict(obs, mode="train")  # training does need it


@pytest.mark.parametrize("family", ["openvla", "pi0", "mlp"])
def test_a_value_free_policy_builds_no_value_head_and_reports_zero_values(tmp_path, family):
    if family == "mlp":
        cfg, env_spec = MLPConfig(hidden_sizes=[8], add_value_head=False), family_spec("pi0", privileged=False)
        obs = {"states": np.ones((3, 8), dtype=np.float32), "task_descriptions": ["reach"] * 3}
    else:
        cfg = family_config(family, str(tmp_path / "tiny"), value_input="privileged_states", add_value_head=False)
        env_spec, obs = family_spec(family, privileged=False), family_observations(family, 0)
        del obs["privileged_states"]
    policy = build_policy(cfg, env_spec)
    assert not [n for n, _ in policy.named_parameters() if n.startswith(policy.value_parameter_prefixes)]
    out = policy.predict(obs)
    assert torch.equal(out.values, torch.zeros(3)) and torch.equal(policy.value(obs), torch.zeros(3))
    logprobs, _, values = policy.evaluate(out.forward_inputs, out.actions)
    assert torch.equal(values, torch.zeros(3)) and logprobs.requires_grad
